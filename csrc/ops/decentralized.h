// Decentralized SGD's weight averaging, full precision.
//
// data = this rank's weights (read only), result = the peer-averaged weights.
// Step number s communicates when s % communication_interval == 0; the
// frontend then replaces its weights by the result before the optimizer step:
// x_{t+1} = avg(x_t) - lr * g(x_t). Since the step never writes the weights,
// it can run while forward/backward read them.
//
// Peer modes, on a communicator of n ranks, rank r, communication c = s / interval:
//   all:       result = mean over all ranks of their weights.
//   shift_one: n must be even; with h = n / 2,
//              partner = h + ((c + r) mod h) if r < h else (r - h - c) mod h
//              (symmetric pairs, rotating every communication);
//              result = (mine + partner's) / 2. The lower rank of a pair sends
//              first, so the exchange cannot deadlock on blocking transports.
// Hierarchical: the node leader reduces (AVG) the node's weights into the
// result, exchanges that with other leaders as above (n = number of nodes),
// then broadcasts the result to its node. Scratch slot 0: a partner's weights.
//
// Registered as "decentralized"; parameters: peer_selection_mode (string,
// "all"), communication_interval (int >= 1, 1), hierarchical (bool, false).
#pragma once

#include <cstdint>
#include <string>

#include "ops/algorithm_step.h"

namespace bagua {

enum class PeerMode { kAll, kShiftOne };

// "all" or "shift_one"; InvalidArgument otherwise.
PeerMode parse_peer_mode(const std::string& mode);
const char* peer_mode_name(PeerMode mode);

// The shift_one partner of `rank` among n (even) ranks at communication c.
int shift_one_peer(int rank, int n, int64_t comm_step);

class DecentralizedStep : public Step {
 public:
  // Throws InvalidArgument for shift_one with an odd number of peers (the
  // group size, or the number of nodes when hierarchical) or interval < 1.
  DecentralizedStep(CommSet comms, const StepParams& params);
  std::string describe() const override;
  bool has_result() const override { return true; }
  void check(DType dtype, size_t count) const override;
  bool communicates(int64_t step) const override { return step % interval_ == 0; }
  bool run(const ExecContext& ctx, Span data, Span result, int64_t step) const override;

 private:
  void exchange_and_average(Communicator& c, const ExecContext& ctx, Span mine, Span peer, int64_t comm_step) const;

  CommSet comms_;
  PeerMode mode_;
  int64_t interval_;
  bool hierarchical_;
};

}  // namespace bagua
