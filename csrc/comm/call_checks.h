// The argument checks of a communicator call, shared by every backend (Gloo,
// NCCL), so one mistake reads the same whatever the communicator. Each check
// throws InvalidArgument "<communicator>: <op>: <why>". The debug-checking
// wrapper (comm/checked_communicator.h) compares calls across ranks and
// leaves these to the communicator it wraps.
#pragma once

#include <cstddef>
#include <string>
#include <vector>

#include "comm/communicator.h"
#include "comm/op_desc.h"

namespace bagua {

class CallChecks {
 public:
  CallChecks(const Communicator& comm, const OpDesc& call) : comm_(comm), call_(call) {}

  [[noreturn]] void invalid(const std::string& why) const;
  // A known dtype, and a known reduce op where the call has one.
  const CallChecks& dtype() const;
  // The call's root in [0, size).
  const CallChecks& root() const;
  // The call's peer (send/recv) in [0, size) and not this rank.
  const CallChecks& peer() const;
  // `p` may be null only when it holds no elements.
  const CallChecks& buffer(const void* p, size_t count, const char* what) const;
  // alltoall_v's counts and displacements of one side (`what` is "send" or
  // "recv"): one per rank, no overflow, receive regions disjoint. Returns the
  // elements the buffer must hold (the end of the furthest region).
  size_t layout(const void* p, const std::vector<size_t>& counts, const std::vector<size_t>& displs,
                const char* what) const;

 private:
  void in_range(int64_t r, const char* what) const;

  const Communicator& comm_;
  const OpDesc& call_;
};

}  // namespace bagua
