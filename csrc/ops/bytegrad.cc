#include "ops/bytegrad.h"

#include "ops/compressed_exchange.h"
#include "ops/elementwise.h"
#include "ops/hierarchical.h"

namespace bagua {

ByteGradStep::ByteGradStep(CommSet comms, const StepParams& params) : comms_(std::move(comms)) {
  const std::string name = "bytegrad";
  params.check_known(name, {"hierarchical", "average"});
  hierarchical_ = params.get_bool(name, "hierarchical", false);
  average_ = params.get_bool(name, "average", true);
  if (!comms_.global) throw InvalidArgument(name + ": no communicator");
  if (hierarchical_) comms_.check_hierarchical(name);
}

std::string ByteGradStep::describe() const {
  return std::string("bytegrad(hierarchical=") + (hierarchical_ ? "true" : "false") +
         ", average=" + (average_ ? "true" : "false") + ")";
}

void ByteGradStep::check(DType dtype, size_t count) const {
  if (!is_floating(dtype))
    throw InvalidArgument(describe() + ": data of " + dtype_name(dtype) +
                          "; MinMaxUInt8 compression needs float32, float64, float16 or bfloat16");
  Step::check(dtype, count);
}

bool ByteGradStep::run(const ExecContext& ctx, Span data, Span, int64_t) const {
  run_centralized(comms_, ctx, hierarchical_, data, average_ ? ReduceOp::kAvg : ReduceOp::kSum,
                  [&](Communicator& c) { compressed_scatter_reduce_gather(c, ctx, data, average_); });
  return true;
}

}  // namespace bagua
