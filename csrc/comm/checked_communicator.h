// Debug checks (setting BAGUA_DEBUG_CHECKS): a decorator that, before every
// collective, allgathers a small descriptor of the call (operation, sequence
// number, dtype, count, root, reduce op) over the wrapped communicator and
// raises bagua::MismatchError on every rank when the ranks disagree, naming
// the first rank that differs from rank 0 and both calls, e.g.
//   "rank 1 called broadcast(float32, count=10, root=0) while rank 0 called
//    allreduce(float32, count=10, SUM)".
// alltoall_v also checks that every rank's send counts match the receiving
// rank's recv counts. send/recv exchange descriptors with the peer (the lower
// rank speaks first) and check they form a matching send/recv pair.
// Costs one small allgather per collective and a round trip per send/recv.
#pragma once

#include "comm/communicator.h"

namespace bagua {

CommunicatorPtr make_checked_communicator(CommunicatorPtr inner);

}  // namespace bagua
