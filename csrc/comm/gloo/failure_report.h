// What a failed Gloo communicator operation says, and which error it raises.
//
// The message names the group, the operation and its number, what happened
// (timed out after the timeout, lost the connection to a peer, or failed),
// then what the store knows: the ranks reported dead, and for a collective
// the ranks that never reached it (each failing rank says so in the store
// under <prefix>/failed/<rank> = its op number; the silent ones were stuck or
// busy elsewhere) or failed at another operation. A timeout raises
// TimeoutError, a lost connection PeerError (naming a dead rank when the store
// knows one), anything else Error.
#pragma once

#include <chrono>
#include <cstdint>
#include <string>

#include "comm/gloo/communicator.h"
#include "comm/op_desc.h"
#include "store/store.h"

namespace bagua {

enum class FailureKind { kTimedOut, kLostPeer, kOther };

class FailureReport {
 public:
  // `dead_ranks` may be empty (no dead-rank note); `store` may be null (no
  // absent-rank note).
  FailureReport(StorePtr store, std::string prefix, int rank, int size, std::chrono::milliseconds timeout,
                DeadRanksFn dead_ranks);

  // "<who>: <op> (op #<seq>) timed out after ... ms" and the like; `peer` < 0:
  // unknown.
  std::string headline(const std::string& who, const OpDesc& d, uint64_t seq, int peer, FailureKind kind) const;

  // What the store knows, to append to the headline: says this rank failed at
  // op `seq` (for a failed collective), then names the dead ranks and the
  // absent ones. Waits briefly for the peers; call it after closing the
  // connections, so peers blocked on this rank fail first. Sets *dead to a
  // dead rank, or leaves it.
  std::string explain(const OpDesc& d, uint64_t seq, FailureKind kind, int* dead);

 private:
  std::string dead_ranks_note(FailureKind kind, int* first_dead) const;
  std::string failed_key(int r) const;
  void say_failed(uint64_t seq) const;
  std::string absent_ranks_note(uint64_t seq) const;

  const StorePtr store_;
  const std::string prefix_;
  const int rank_;
  const int size_;
  const std::chrono::milliseconds timeout_;
  const DeadRanksFn dead_ranks_;
};

// Raises the error of `kind` with message `msg`; a PeerError names `peer`.
[[noreturn]] void throw_failure(FailureKind kind, const std::string& msg, int peer);

}  // namespace bagua
