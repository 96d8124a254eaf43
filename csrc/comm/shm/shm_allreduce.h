// Allreduce through POSIX shared memory among the ranks of a group that all
// run on one host (same kernel and namespaces, see host_identity.h).
//
// Set-up: join() exchanges host identities (and the settings that must match)
// through the store when the communicator is created; it returns null, on
// every rank alike, unless all ranks share them. The segment is made on the
// first allreduce that uses it (map(), collective): rank 0 creates it, the
// others open it, and rank 0 unlinks its name as soon as every rank said
// through the store that it mapped it (so nothing stays in /dev/shm). If a
// rank could not map it (a full /dev/shm, say), every rank learns so and map()
// returns false everywhere from then on: the caller stays on TCP.
//
// Data path: each rank owns one slot of `window_bytes` per buffer, and there
// are two buffers, so an allreduce of any size is pipelined in chunks of one
// window. For a chunk, every rank copies its input into its slot (all but its
// own sub-range); rank r reduces sub-range r of the chunk over all ranks'
// inputs in rank order 0..n-1 (the same bits on every rank; with 2 ranks the
// bits of Gloo's ring, as the kernels give a op b == b op a), divides it for
// AVG, and every rank copies the other sub-ranges of the result out. The next
// chunk goes in while the peers still reduce this one. Generation counters in the segment order the steps;
// a buffer is reused two chunks later, once every rank has copied it out.
//
// Failures: every wait is bounded by the timeout. A timeout throws ShmTimeout
// naming the ranks that did not reach the step; a rank the store reports dead,
// or a rank that gave up (abort()), throws ShmPeerLost. One call at a time per
// object (the communicator's operation lock serialises them).
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

#include "comm/shm/shm_segment.h"
#include "common/dtype.h"
#include "kernels/reduce.h"
#include "store/store.h"

namespace bagua {

class ShmTimeout : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

class ShmPeerLost : public std::runtime_error {
 public:
  ShmPeerLost(const std::string& what, int peer) : std::runtime_error(what), peer_(peer) {}
  int peer() const { return peer_; }

 private:
  int peer_;
};

struct ShmAllreduceOptions {
  size_t window_bytes;     // per rank and buffer; a multiple of 64
  size_t threshold_bytes;  // smaller allreduces are left to the caller (TCP)
  std::chrono::milliseconds timeout;
  std::function<std::vector<int>()> dead_ranks;  // may be empty
};

class ShmAllreduce {
 public:
  // `enabled` false still takes part in the exchange (so the peers agree to do without).
  static std::unique_ptr<ShmAllreduce> join(const StorePtr& store, const std::string& prefix, int rank, int size,
                                            bool enabled, ShmAllreduceOptions options);
  ~ShmAllreduce();

  bool covers(size_t bytes) const { return bytes >= options_.threshold_bytes; }

  // Collective on first call: maps the segment. False when it is unavailable (on every rank).
  bool map();
  // Why map() returned false ("" otherwise).
  const std::string& unavailable() const { return unavailable_; }

  // recv may equal send. `fn` reduces like cpu_reduce_fn(dtype, op).
  void allreduce(const void* send, void* recv, size_t count, DType dtype, ReduceOp op, ReduceFn fn);

  // Tells peers waiting on this rank that it will not come (after a failure, on close).
  // `timed_out`: this rank gave up at its own deadline (a peer is stuck), so the
  // waiters fail with ShmTimeout like it did, not with ShmPeerLost naming it.
  void abort(bool timed_out = false);

 private:
  ShmAllreduce(StorePtr store, std::string prefix, int rank, int size, ShmAllreduceOptions options);

  enum Counter { kArrived = 0, kReduced = 1, kCopied = 2 };
  uint32_t* counter(int rank, Counter c) const;
  uint32_t* abort_word() const;
  uint8_t* slot(int buffer, int rank) const;
  uint8_t* result(int buffer) const;
  void wait_all(Counter c, uint32_t target, const char* step);
  std::string setup_segment();

  StorePtr store_;
  const std::string prefix_;
  const int rank_;
  const int size_;
  ShmAllreduceOptions options_;
  std::optional<ShmSegment> segment_;
  bool mapped_ = false;
  std::string unavailable_;
  uint64_t generation_ = 0;  // chunks done; the counters hold its low 32 bits
};

}  // namespace bagua
