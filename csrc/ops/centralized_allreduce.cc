#include "ops/centralized_allreduce.h"

#include "ops/hierarchical.h"

namespace bagua {

CentralizedAllreduceStep::CentralizedAllreduceStep(CommSet comms, const StepParams& params) : comms_(std::move(comms)) {
  const std::string name = "centralized_allreduce";
  params.check_known(name, {"hierarchical", "average"});
  hierarchical_ = params.get_bool(name, "hierarchical", false);
  average_ = params.get_bool(name, "average", true);
  if (!comms_.global) throw InvalidArgument(name + ": no communicator");
  if (hierarchical_) comms_.check_hierarchical(name);
}

std::string CentralizedAllreduceStep::describe() const {
  return std::string("centralized_allreduce(hierarchical=") + (hierarchical_ ? "true" : "false") +
         ", average=" + (average_ ? "true" : "false") + ")";
}

bool CentralizedAllreduceStep::predict_calls(const Communicator& comm, Span data, int64_t,
                                             std::vector<OpDesc>* calls) const {
  if (hierarchical_ || comms_.global.get() != &comm) return false;
  const ReduceOp op = average_ ? ReduceOp::kAvg : ReduceOp::kSum;
  calls->push_back(OpDesc{OpKind::kAllreduce, data.dtype, static_cast<int64_t>(data.count), -1, op});
  return true;
}

bool CentralizedAllreduceStep::run(const ExecContext& ctx, Span data, Span, int64_t) const {
  const ReduceOp op = average_ ? ReduceOp::kAvg : ReduceOp::kSum;
  run_centralized(comms_, ctx, hierarchical_, data, op,
                  [&](Communicator& c) { c.allreduce(data.data, data.data, data.count, data.dtype, op, ctx.stream); });
  return true;
}

}  // namespace bagua
