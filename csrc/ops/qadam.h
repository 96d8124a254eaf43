// QAdam's communication step. Unlike Bagua 0.9's, it loses no gradient at the
// switch: step t = warmup_steps folds its own gradient into the momentum.
// data = this rank's gradients (read; overwritten in warm-up only).
// State (ops/algorithm_step.h): one span, the Adam momentum m, which the optimizer
// shares (torch: its exp_avg tensors are views of it; JAX: bagua_jax.qadam's
// state carries it).
//
// Step number s (0-based; optimizer step t = s + 1):
//   warm-up, t < warmup_steps: data <- mean over the group of data (flat
//     allreduce, as the original); the optimizer then updates m and v itself;
//   after, t >= warmup_steps: m <- beta1 * m + (1 - beta1) * data (the local
//     gradient, no weight decay; MomentumMath, ops/elementwise.h), then m <-
//     the MinMaxUInt8 compressed scatter-reduce-gather mean of m
//     (ops/compressed_exchange.h; hierarchical: within the node first). The
//     optimizer then steps with m and its frozen second moment.
// Element counts must be a multiple of the group size (the exchange's chunks).
//
// Registered as "qadam"; parameters: warmup_steps (int >= 1, 100), beta1
// (string decimal in [0, 1), "0.9"), hierarchical (bool, false).
#pragma once

#include <cstdint>
#include <string>

#include "ops/algorithm_step.h"

namespace bagua {

class QAdamStep : public Step {
 public:
  QAdamStep(CommSet comms, const StepParams& params);
  std::string describe() const override;
  size_t alignment() const override { return static_cast<size_t>(comms_.global->size()); }
  void check(DType dtype, size_t count) const override;
  int num_state() const override { return 1; }
  // Whether step number s runs in warm-up (allreduces gradients).
  bool warming_up(int64_t step) const { return step + 1 < warmup_steps_; }
  bool run(const ExecContext& ctx, Span data, Span result, int64_t step) const override;
  bool run_with_state(const ExecContext& ctx, Span data, Span result, const std::vector<Span>& state,
                      int64_t step) const override;

 private:
  CommSet comms_;
  int64_t warmup_steps_;
  double beta1_;
  std::string beta1_text_;
  bool hierarchical_;
};

}  // namespace bagua
