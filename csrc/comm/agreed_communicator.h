// Cross-rank call agreement for a communicator that cannot agree on its own
// calls cheaply (NCCL: its buffers are device memory, and a size mismatch
// inside NCCL is a hang until the timeout, not an error): before every
// collective on `data`, the ranks exchange the call's descriptor (operation,
// sequence number, dtype, count, root, reduce op; comm/call_agreement.h) over
// `control`, a host communicator over the same ranks (Gloo), and every rank
// raises bagua::MismatchError with the same message when they differ; `data`
// is then not called, so it stays usable. alltoall_v also compares the count
// matrix.
//
// Cost and batching: one small host allgather (kCallWords int64 per rank,
// Communicator::agreement_allgather) per collective. expect_calls() promises
// the next calls, as on Gloo: the promise travels with the first call's
// agreement and, when every rank promised the same calls, they run without
// an agreement, so an engine lane's step (the engine promises each lane's
// calls on the group's communicator) costs one exchange, not one per bucket. A rank that then breaks its promise raises
// bagua::Error and this communicator refuses every later call (its peers,
// already inside NCCL, fail on NCCL's timeout).
//
// Why per call, with promises, rather than once per engine step only:
// collectives called directly (bagua_core.allreduce on a CUDA tensor) have no
// step to batch into, and the engine already promises each step's calls, so
// its steps pay one exchange anyway. Measured on Gloo
// (benchmarks/agreement_cost.py, 2 local processes, loaded 2-core machine):
// the exchange alone 70-155 us per call, a small Gloo allreduce 180-270 us.
//
// Not agreed: send/recv (pass through; a mismatched pair ends on NCCL's
// timeout), and nothing on groups of one rank. Calls from one thread at a
// time, like every communicator; `control` may serve other host traffic of
// the same group between calls (it keeps one collective order).
// close() closes both communicators.
#pragma once

#include "comm/communicator.h"

namespace bagua {

// Throws bagua::InvalidArgument when either is null or they differ in rank or size.
CommunicatorPtr make_agreed_communicator(CommunicatorPtr data, CommunicatorPtr control);

}  // namespace bagua
