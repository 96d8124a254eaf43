#include "ops/local_steps.h"

#include <cstdio>

#include "ops/compressed_exchange.h"
#include "ops/elementwise.h"
#include "ops/hierarchical.h"
#include "ops/kernels.h"

namespace bagua {
namespace {

std::string number_text(double v) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.17g", v);
  return buf;
}

}  // namespace

LocalStepsStep::LocalStepsStep(CommSet comms, const StepParams& params) : comms_(std::move(comms)) {
  const std::string name = "local_steps";
  params.check_known(name, {"sync_interval", "warmup_steps", "outer_lr", "outer_momentum", "nesterov", "hierarchical",
                            "compression", "error_feedback"});
  interval_ = params.get_int(name, "sync_interval", 8);
  warmup_ = params.get_int(name, "warmup_steps", 0);
  lr_ = params.get_double(name, "outer_lr", 0.7);
  momentum_ = params.get_double(name, "outer_momentum", 0.9);
  nesterov_ = params.get_bool(name, "nesterov", true);
  hierarchical_ = params.get_bool(name, "hierarchical", false);
  const std::string compression = params.get_string(name, "compression", "none");
  error_feedback_ = params.get_bool(name, "error_feedback", false);
  if (compression != "none" && compression != "minmax_uint8")
    throw InvalidArgument(name + ": unknown compression '" + compression + "' (use 'none' or 'minmax_uint8')");
  compressed_ = compression == "minmax_uint8";
  if (error_feedback_ && !compressed_)
    throw InvalidArgument(name + ": error_feedback needs compression='minmax_uint8' (there is no residual without it)");
  if (!comms_.global) throw InvalidArgument(name + ": no communicator");
  if (interval_ < 1) throw InvalidArgument(name + ": sync_interval must be >= 1, got " + std::to_string(interval_));
  if (warmup_ < 0) throw InvalidArgument(name + ": warmup_steps must be >= 0, got " + std::to_string(warmup_));
  if (!(lr_ > 0.0)) throw InvalidArgument(name + ": outer_lr must be > 0, got " + number_text(lr_));
  if (!(momentum_ >= 0.0 && momentum_ < 1.0))
    throw InvalidArgument(name + ": outer_momentum must be in [0, 1), got " + number_text(momentum_));
  if (hierarchical_) comms_.check_hierarchical(name);
}

std::string LocalStepsStep::describe() const {
  return "local_steps(sync_interval=" + std::to_string(interval_) + ", warmup_steps=" + std::to_string(warmup_) +
         ", outer_lr=" + number_text(lr_) + ", outer_momentum=" + number_text(momentum_) +
         ", nesterov=" + (nesterov_ ? "true" : "false") + ", hierarchical=" + (hierarchical_ ? "true" : "false") +
         (compressed_ ? ", compression=minmax_uint8" : "") + (error_feedback_ ? ", error_feedback=true" : "") + ")";
}

void LocalStepsStep::check(DType dtype, size_t count) const {
  if (!is_floating(dtype))
    throw InvalidArgument(describe() + ": weights of " + dtype_name(dtype) + "; the outer step needs a floating dtype");
  Step::check(dtype, count);
}

bool LocalStepsStep::communicates(int64_t step) const {
  return step < warmup_ || (step - warmup_ + 1) % interval_ == 0;
}

bool LocalStepsStep::run(const ExecContext&, Span, Span, int64_t) const {
  throw InvalidArgument(describe() + ": needs its anchor and momentum; run it through run_with_state()");
}

void LocalStepsStep::average(const ExecContext& ctx, Span data, bool compress, const Span* error) const {
  run_centralized(comms_, ctx, hierarchical_, data, ReduceOp::kAvg, [&](Communicator& c) {
    if (compress)
      compressed_scatter_reduce_gather(c, ctx, data, true, error);
    else
      c.allreduce(data.data, data.data, data.count, data.dtype, ReduceOp::kAvg, ctx.stream);
  });
}

bool LocalStepsStep::run_with_state(const ExecContext& ctx, Span data, Span, const std::vector<Span>& state,
                                    int64_t step) const {
  if (state.size() != static_cast<size_t>(num_state()))
    throw InvalidArgument(describe() + ": needs " + std::to_string(num_state()) +
                          " state spans (the anchor, the outer momentum" + (error_feedback_ ? ", the residual)" : ")"));
  for (const Span& s : state) {
    if (s.count != data.count || s.dtype != data.dtype)
      throw InvalidArgument(describe() + ": its state spans must have the weights' size and dtype");
  }
  if (!communicates(step)) return false;
  const Span& anchor = state[0];
  const Span& momentum = state[1];
  if (step < warmup_) {
    average(ctx, data, false, nullptr);
    step_kernels::copy(ctx, anchor.data, data.data, data.nbytes());
    return true;
  }
  const bool first_outer_step = step - warmup_ + 1 == interval_;
  const Span* residual = error_feedback_ ? &state[2] : nullptr;
  if (residual && first_outer_step) step_kernels::fill_zero(ctx, residual->data, residual->nbytes());
  step_kernels::pseudo_gradient(ctx, data.data, anchor.data, data.count, data.dtype);
  average(ctx, data, compressed_, residual);
  step_kernels::outer_sgd(ctx, data.data, anchor.data, momentum.data, data.data, data.count, data.dtype, lr_, momentum_,
                          nesterov_, first_outer_step);
  return true;
}

}  // namespace bagua
