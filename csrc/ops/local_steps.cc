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
                            "compression", "error_feedback", "topk_density"});
  interval_ = params.get_int(name, "sync_interval", 8);
  warmup_ = params.get_int(name, "warmup_steps", 0);
  lr_ = params.get_double(name, "outer_lr", 0.7);
  momentum_ = params.get_double(name, "outer_momentum", 0.9);
  nesterov_ = params.get_bool(name, "nesterov", true);
  hierarchical_ = params.get_bool(name, "hierarchical", false);
  const std::string compression = params.get_string(name, "compression", "none");
  error_feedback_ = params.get_bool(name, "error_feedback", false);
  const bool has_density = params.has("topk_density");
  const double density = params.get_double(name, "topk_density", 0.02);
  if (compression != "none") codec_ = Codec::make(name, compression, density);
  if (has_density && !(codec_ && codec_->sparse()))
    throw InvalidArgument(name + ": topk_density is for the top-k compressions (topk_uint4, topk_uint2), not '" +
                          compression + "'");
  compressed_ = codec_.has_value();
  if (error_feedback_ && !compressed_)
    throw InvalidArgument(name + ": error_feedback needs a compression (there is no residual without it)");
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
         (compressed_ ? ", compression=" + codec_->name() : "") +
         (compressed_ && codec_->sparse() ? ", topk_k=" + std::to_string(codec_->topk_k()) + "/256" : "") +
         (error_feedback_ ? ", error_feedback=true" : "") + ")";
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
    if (compress && codec_->sparse())
      compressed_allgather_reduce(c, ctx, data, true, error, *codec_);
    else if (compress)
      compressed_scatter_reduce_gather(c, ctx, data, true, error, &*codec_);
    else
      c.allreduce(data.data, data.data, data.count, data.dtype, ReduceOp::kAvg, ctx.stream);
  });
}

void LocalStepsStep::refuse_nonfinite(const ExecContext& ctx, Span data, const Span& anchor, size_t mine_bad) const {
  // Every exchange carries NaN and Inf through (the codecs decode a non-finite block to NaN), so
  // the average is non-finite on every rank exactly when some rank's pseudo-gradient was: all
  // ranks raise at the same step, and none waits for a peer.
  if (step_kernels::count_nonfinite(ctx, data.data, data.count, data.dtype, kCountSlot) == 0) return;
  step_kernels::copy(ctx, data.data, anchor.data, data.nbytes());  // the weights of the last synchronisation
  const std::string whose = mine_bad > 0 ? "this rank's own holds " + std::to_string(mine_bad) + " of its " +
                                               std::to_string(data.count) + " values"
                                         : "this rank's own is finite: the NaN or Inf came from another rank";
  throw Error(describe() + ": NaN or Inf in the pseudo-gradient on rank " + std::to_string(comms_.global->rank()) +
              " (" + whose +
              "); this bucket's weights are back at the last synchronisation and nothing was applied to them");
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
  const size_t mine_bad = step_kernels::count_nonfinite(ctx, data.data, data.count, data.dtype, kCountSlot);
  average(ctx, data, compressed_, residual);
  refuse_nonfinite(ctx, data, anchor, mine_bad);
  step_kernels::outer_sgd(ctx, data.data, anchor.data, momentum.data, data.data, data.count, data.dtype, lr_, momentum_,
                          nesterov_, first_outer_step);
  return true;
}

}  // namespace bagua
