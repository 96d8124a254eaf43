// When a Gloo communicator's float32 SUM/AVG allreduce takes the packed path
// (comm/gloo/packed_allreduce.h) instead of Gloo's ring, and when its senders
// pack (GlooCommunicatorOptions::wire_packing).
//
// Every rank must run the same algorithm, or the packed exchange meets Gloo's
// ring and only the timeout ends it. So the setting is compared once, at
// creation (agree_on_wire_packing), and under kAuto the switch is voted: each
// rank measures the link on its packable allreduces (note_link_rate), and the
// ranks allgather one word, "slow", at the kFirstVote-th packable call and
// every kVoteEvery-th after it; the packed path is taken while every rank
// voted slow. Whether a sender packs is its own choice (receivers read the
// format of each message), so that follows the rank's latest measure.
// Not thread-safe: the communicator's operation lock serialises the calls.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "comm/gloo/communicator.h"
#include "common/dtype.h"
#include "store/store.h"

namespace bagua {

// Raises MismatchError on every rank when the ranks' wire_packing settings
// differ; `who` names the group. Collective, through the store under `prefix`.
void agree_on_wire_packing(Store& store, const std::string& prefix, int rank, int size, WirePacking mine,
                           std::chrono::milliseconds timeout, const std::string& who);

class WirePackingPolicy {
 public:
  explicit WirePackingPolicy(const GlooCommunicatorOptions& options);

  // Float32 SUM/AVG of at least wire_packing_min_bytes.
  bool packable(DType dtype, ReduceOp op, size_t bytes) const;

  // Whether this allreduce takes the packed path: the same answer on every
  // rank, given the same calls. `vote(mine)` allgathers one word per rank
  // (collective); it is called on kAuto's voting calls only.
  bool takes_packed_path(DType dtype, ReduceOp op, size_t bytes,
                         const std::function<std::vector<int64_t>(int64_t)>& vote);

  // Whether this rank's sends go packed (kOn: always; else while the link seems slow).
  bool senders_pack() const;

  // A packable allreduce moved `bytes` over the link in `seconds`.
  void note_link_rate(double bytes, double seconds);

 private:
  // A rank votes "slow" when even its fastest packable call since the last
  // vote stayed below the threshold: a call that waited for a late peer, or
  // for a CPU, looks slow, but not all of them.
  static constexpr uint64_t kFirstVote = 3;
  static constexpr uint64_t kVoteEvery = 16;

  const WirePacking mode_;
  const size_t min_bytes_;
  const double slow_bits_per_s_;
  double link_bits_per_s_ = 0;  // measured by the last packable allreduce; 0: none yet
  double best_bits_per_s_ = 0;  // the fastest packable allreduce since the last vote
  uint64_t packable_calls_ = 0;
  bool packed_path_ = false;  // kAuto: what the ranks last voted
};

}  // namespace bagua
