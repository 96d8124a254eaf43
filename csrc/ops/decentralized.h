// Decentralized SGD's weight averaging (§2.3), full precision.
//
// The bucket holds weights. Each execution is one training step; the op
// communicates on steps 0, k, 2k, ... (k = communication_interval) and writes
// the peer-averaged weights into its own peer buffer, never into the bucket,
// so it can run while forward/backward read the weights. After the engine's
// wait(), the frontend calls copy_back() (weights <- peer average) and then
// the optimizer step: x_{t+1} = avg(x_t) - lr * g(x_t).
//
// Peer modes, on a communicator of n ranks, rank r:
//   all:       peer = mean over all ranks of their weights.
//   shift_one: n must be even; with h = n / 2 and c = step / interval,
//              partner = h + ((c + r) mod h) if r < h else (r - h - c) mod h
//              (symmetric pairs, rotating every communication);
//              peer = (mine + partner's) / 2. The lower rank of a pair sends
//              first, so the exchange cannot deadlock on blocking transports.
// Hierarchical: the node leader reduces (AVG) the node's weights into the
// peer buffer, exchanges that with other leaders as above (n = number of
// nodes), then broadcasts the peer buffer to its node.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>

#include "ops/comm_set.h"
#include "ops/op.h"

namespace bagua {

enum class PeerMode { kAll, kShiftOne };

// "all" or "shift_one"; InvalidArgument otherwise.
PeerMode parse_peer_mode(const std::string& mode);
const char* peer_mode_name(PeerMode mode);

// The shift_one partner of `rank` among n (even) ranks at communication c.
int shift_one_peer(int rank, int n, int64_t comm_step);

class DecentralizedOp : public Op {
 public:
  // Throws InvalidArgument for shift_one with an odd number of peers (the
  // group size, or the number of nodes when hierarchical) or interval < 1.
  DecentralizedOp(CommSet comms, PeerMode mode, int64_t communication_interval, bool hierarchical);
  std::string describe() const override;
  void bind(const BucketPtr& bucket) override;
  void execute(Bucket& bucket) override;

  // Executions so far (training steps seen); settable to restore a checkpoint.
  int64_t step() const { return step_.load(); }
  void set_step(int64_t step);
  // Whether the next execution communicates.
  bool communicates_next() const { return step_.load() % interval_ == 0; }
  // Whether the last execution communicated (copy_back then has something to copy).
  bool last_communicated() const { return last_communicated_.load(); }

  // The peer-averaged weights (same layout as the bucket).
  void* peer_data() const { return peer_.get(); }
  const std::shared_ptr<void>& peer_memory() const { return peer_; }
  const BucketPtr& bucket() const { return bucket_; }

  // bucket <- peer buffer, if the last execution communicated. Call only
  // after the engine's wait(); throws Error while the op is running.
  // Returns whether it copied.
  bool copy_back();

 private:
  void exchange_and_average(Communicator& c, const void* mine, void* peer, void* scratch, size_t count, DType dt,
                            int64_t comm_step);

  CommSet comms_;
  PeerMode mode_;
  int64_t interval_;
  bool hierarchical_;
  BucketPtr bucket_;
  std::shared_ptr<void> peer_;
  std::shared_ptr<void> scratch_;  // hierarchical shift_one: the partner's weights
  std::atomic<int64_t> step_{0};
  std::atomic<bool> last_communicated_{false};
  std::atomic<bool> running_{false};
};

}  // namespace bagua
