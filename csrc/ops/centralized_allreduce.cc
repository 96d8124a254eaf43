#include "ops/centralized_allreduce.h"

#include "ops/hierarchical.h"

namespace bagua {

CentralizedAllreduceOp::CentralizedAllreduceOp(CommSet comms, bool hierarchical, bool average)
    : comms_(std::move(comms)), hierarchical_(hierarchical), average_(average) {
  if (!comms_.global) throw InvalidArgument("centralized_allreduce: no communicator");
  if (hierarchical_) comms_.check_hierarchical("centralized_allreduce");
}

std::string CentralizedAllreduceOp::describe() const {
  return std::string("centralized_allreduce(hierarchical=") + (hierarchical_ ? "true" : "false") +
         ", average=" + (average_ ? "true" : "false") + ")";
}

void CentralizedAllreduceOp::bind(const BucketPtr&) {
  if (bound_) throw InvalidArgument(describe() + " is already part of another bucket's chain");
  bound_ = true;
}

void CentralizedAllreduceOp::execute(Bucket& bucket) {
  const ReduceOp op = average_ ? ReduceOp::kAvg : ReduceOp::kSum;
  void* data = bucket.data();
  const size_t n = bucket.numel();
  const DType dt = bucket.dtype();
  run_centralized(comms_, hierarchical_, data, n, dt, op,
                  [&](Communicator& c) { c.allreduce(data, data, n, dt, op); });
}

}  // namespace bagua
