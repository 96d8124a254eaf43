#include "ops/hierarchical.h"

namespace bagua {

void run_centralized(const CommSet& comms, const ExecContext& ctx, bool hierarchical, Span data, ReduceOp intra_op,
                     const std::function<void(Communicator&)>& step) {
  if (!hierarchical) {
    step(*comms.global);
    return;
  }
  const bool leader = comms.is_leader();
  comms.intra->reduce(data.data, leader ? data.data : nullptr, data.count, data.dtype, intra_op, 0, ctx.stream);
  if (leader) step(*comms.inter);
  comms.intra->broadcast(data.data, data.count, data.dtype, 0, ctx.stream);
}

}  // namespace bagua
