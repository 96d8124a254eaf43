#include "ops/bytegrad.h"

#include "ops/compressed_exchange.h"
#include "ops/elementwise.h"
#include "ops/hierarchical.h"

namespace bagua {

ByteGradStep::ByteGradStep(CommSet comms, const StepParams& params) : comms_(std::move(comms)) {
  const std::string name = "bytegrad";
  params.check_known(name, {"hierarchical", "average", "error_feedback"});
  hierarchical_ = params.get_bool(name, "hierarchical", false);
  average_ = params.get_bool(name, "average", true);
  error_feedback_ = params.get_bool(name, "error_feedback", false);
  if (!comms_.global) throw InvalidArgument(name + ": no communicator");
  if (hierarchical_) comms_.check_hierarchical(name);
}

std::string ByteGradStep::describe() const {
  return std::string("bytegrad(hierarchical=") + (hierarchical_ ? "true" : "false") +
         ", average=" + (average_ ? "true" : "false") + (error_feedback_ ? ", error_feedback=true" : "") + ")";
}

void ByteGradStep::check(DType dtype, size_t count) const {
  if (!is_floating(dtype))
    throw InvalidArgument(describe() + ": data of " + dtype_name(dtype) +
                          "; MinMaxUInt8 compression needs float32, float64, float16 or bfloat16");
  Step::check(dtype, count);
}

bool ByteGradStep::run(const ExecContext& ctx, Span data, Span result, int64_t step) const {
  if (error_feedback_) throw InvalidArgument(describe() + ": needs its residual; run it through run_with_state()");
  return run_with_state(ctx, data, result, {}, step);
}

bool ByteGradStep::run_with_state(const ExecContext& ctx, Span data, Span, const std::vector<Span>& state,
                                  int64_t) const {
  if (state.size() != static_cast<size_t>(num_state()) ||
      (error_feedback_ && (state[0].count != data.count || state[0].dtype != data.dtype)))
    throw InvalidArgument(describe() + (error_feedback_
                                            ? ": needs one state span (the residual) of the data's size and dtype"
                                            : ": keeps no state"));
  const Span* error = error_feedback_ ? &state[0] : nullptr;
  run_centralized(comms_, ctx, hierarchical_, data, average_ ? ReduceOp::kAvg : ReduceOp::kSum,
                  [&](Communicator& c) { compressed_scatter_reduce_gather(c, ctx, data, average_, error); });
  return true;
}

}  // namespace bagua
