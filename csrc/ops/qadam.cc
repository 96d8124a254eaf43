#include "ops/qadam.h"

#include <cerrno>
#include <cstdlib>

#include "ops/compressed_exchange.h"
#include "ops/elementwise.h"
#include "ops/hierarchical.h"
#include "ops/kernels.h"

namespace bagua {

QAdamStep::QAdamStep(CommSet comms, const StepParams& params) : comms_(std::move(comms)) {
  const std::string name = "qadam";
  params.check_known(name, {"warmup_steps", "beta1", "hierarchical"});
  warmup_steps_ = params.get_int(name, "warmup_steps", 100);
  beta1_text_ = params.get_string(name, "beta1", "0.9");
  hierarchical_ = params.get_bool(name, "hierarchical", false);
  if (!comms_.global) throw InvalidArgument(name + ": no communicator");
  if (warmup_steps_ < 1)
    throw InvalidArgument(name + ": warmup_steps must be >= 1, got " + std::to_string(warmup_steps_));
  char* end = nullptr;
  errno = 0;
  beta1_ = std::strtod(beta1_text_.c_str(), &end);
  if (beta1_text_.empty() || *end != '\0' || errno != 0 || !(beta1_ >= 0.0 && beta1_ < 1.0))
    throw InvalidArgument(name + ": beta1 must be a decimal in [0, 1), got '" + beta1_text_ + "'");
  if (hierarchical_) comms_.check_hierarchical(name);
}

std::string QAdamStep::describe() const {
  return "qadam(warmup_steps=" + std::to_string(warmup_steps_) + ", beta1=" + beta1_text_ +
         ", hierarchical=" + (hierarchical_ ? "true" : "false") + ")";
}

void QAdamStep::check(DType dtype, size_t count) const {
  if (dtype != DType::kFloat32 && dtype != DType::kFloat64)
    throw InvalidArgument(describe() + ": gradients of " + dtype_name(dtype) + "; QAdam needs float32 or float64");
  Step::check(dtype, count);
}

bool QAdamStep::run(const ExecContext&, Span, Span, int64_t) const {
  throw InvalidArgument(describe() + ": needs its momentum; run it through run_with_state()");
}

bool QAdamStep::run_with_state(const ExecContext& ctx, Span data, Span, const std::vector<Span>& state,
                               int64_t step) const {
  if (state.size() != 1 || state[0].count != data.count || state[0].dtype != data.dtype)
    throw InvalidArgument(describe() + ": needs one state span (the momentum) of the gradients' size and dtype");
  if (data.count == 0) return true;
  if (warming_up(step)) {
    comms_.global->allreduce(data.data, data.data, data.count, data.dtype, ReduceOp::kAvg, ctx.stream);
    return true;
  }
  const Span& m = state[0];
  step_kernels::momentum_update(ctx, m.data, data.data, data.count, data.dtype, beta1_);
  run_centralized(comms_, ctx, hierarchical_, m, ReduceOp::kAvg,
                  [&](Communicator& c) { compressed_scatter_reduce_gather(c, ctx, m, true); });
  return true;
}

}  // namespace bagua
