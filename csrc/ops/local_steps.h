// Local steps with an outer optimizer (local SGD / DiLoCo): each rank runs
// its own optimizer for sync_interval steps without communicating; then the
// pseudo-gradient, how far the weights moved since the last synchronisation,
// is averaged over the ranks and applied to the common anchor by an outer SGD
// with (Nesterov) momentum.
//
// data = this rank's weights after its local optimizer step, in place. State
// (ops/step.h), two spans initialised with the weights: A = the anchor (the
// weights of the last synchronisation, equal on every rank), M = the outer
// momentum (its initial value is never read: the first outer step starts it
// from zero).
// Step number s (one per optimizer step):
//   s < warmup_steps: data <- average of data over the ranks; A <- data.
//   else, when (s - warmup_steps + 1) % sync_interval == 0:
//     d = average over the ranks of (A - data)
//     M = mu * M + d            (M = d at the first outer step)
//     u = nesterov ? d + mu * M : M
//     A = A - lr * u;  data <- A
//   other steps do nothing (no communication).
// lr = 1, mu = 0 is plain periodic weight averaging (post-local SGD): A - d is
// the ranks' average up to rounding. Element math: ops/elementwise.h
// OuterSgdMath (float32, float64 for float64 weights). Hierarchical: the
// averages reduce within each node first and run among node leaders.
//
// Registered as "local_steps"; parameters: sync_interval (int >= 1, 8),
// warmup_steps (int >= 0, 0), outer_lr (number > 0, 0.7), outer_momentum
// (number in [0, 1), 0.9), nesterov (bool, true), hierarchical (bool, false).
#pragma once

#include <cstdint>
#include <string>

#include "ops/step.h"

namespace bagua {

class LocalStepsStep : public Step {
 public:
  static constexpr int kState = 2;  // A, M

  LocalStepsStep(CommSet comms, const StepParams& params);
  std::string describe() const override;
  void check(DType dtype, size_t count) const override;
  bool communicates(int64_t step) const override;
  int num_state() const override { return kState; }
  // Throws InvalidArgument: the step needs its state (run_with_state).
  bool run(const ExecContext& ctx, Span data, Span result, int64_t step) const override;
  bool run_with_state(const ExecContext& ctx, Span data, Span result, const std::vector<Span>& state,
                      int64_t step) const override;

 private:
  void average(const ExecContext& ctx, Span data) const;

  CommSet comms_;
  int64_t interval_;
  int64_t warmup_;
  double lr_;
  double momentum_;
  bool nesterov_;
  bool hierarchical_;
};

}  // namespace bagua
