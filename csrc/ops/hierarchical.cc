#include "ops/hierarchical.h"

namespace bagua {

void run_centralized(const CommSet& comms, bool hierarchical, void* data, size_t count, DType dtype,
                     ReduceOp intra_op, const std::function<void(Communicator&)>& step) {
  if (!hierarchical) {
    step(*comms.global);
    return;
  }
  const bool leader = comms.is_leader();
  comms.intra->reduce(data, leader ? data : nullptr, count, dtype, intra_op, 0);
  if (leader) step(*comms.inter);
  comms.intra->broadcast(data, count, dtype, 0);
}

}  // namespace bagua
