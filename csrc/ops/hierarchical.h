// The flat / hierarchical execution shape shared by the centralized steps.
#pragma once

#include <cstddef>
#include <functional>

#include "common/dtype.h"
#include "ops/comm_set.h"
#include "ops/algorithm_step.h"

namespace bagua {

// Flat: step(*comms.global). Hierarchical: reduce `data` within the node into
// the leader with `intra_op` (AVG or SUM), step(*comms.inter) on leaders only,
// then broadcast `data` from the leader to the node.
void run_centralized(const CommSet& comms, const ExecContext& ctx, bool hierarchical, Span data, ReduceOp intra_op,
                     const std::function<void(Communicator&)>& step);

}  // namespace bagua
