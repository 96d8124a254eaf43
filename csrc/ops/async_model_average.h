// Asynchronous model average, full precision.
//
// Runs on a background thread (sched/async_averager.h), never in a training
// step's op chain, on communicators nobody else uses. One round:
//   1. the ranks agree whether to go on: all_stopped(stopped) is an
//      allreduce(MIN) of each rank's stop request, so the loop ends on every
//      rank at the same round, once every rank asked;
//   2. run(): data = a snapshot of the weights (taken under the weight lock),
//      result = the mean of every rank's snapshot (allreduce AVG, unlocked);
//   3. apply(), under the weight lock: w = avg + (w - snapshot). It keeps the
//      local progress made since the snapshot, and gives exactly avg where the
//      weights did not change: after a round with training stopped every rank
//      holds the same weights.
//
// Registered as "async_model_average"; parameters: peer_selection_mode
// (string, "all": the only mode, as in Bagua 0.9), sync_interval_ms (int >= 0,
// 500: pause between rounds; 0: rounds back to back). Flat only.
#pragma once

#include <cstdint>
#include <string>

#include "ops/algorithm_step.h"

namespace bagua {

class AsyncModelAverageStep : public Step {
 public:
  AsyncModelAverageStep(CommSet comms, const StepParams& params);
  std::string describe() const override;
  bool has_result() const override { return true; }
  void check(DType dtype, size_t count) const override;
  // result <- mean over the ranks of data (the snapshot).
  bool run(const ExecContext& ctx, Span data, Span result, int64_t step) const override;

  // weights <- average + (weights - snapshot).
  void apply(const ExecContext& ctx, Span weights, Span snapshot, Span average) const;
  // Collective over `control`, a host communicator of the same ranks (the
  // step's own when it is one): true when every rank passed stopped = true.
  // The flag is host memory, so it never travels on a device communicator.
  bool all_stopped(Communicator& control, bool stopped) const;

  int64_t sync_interval_ms() const { return interval_ms_; }
  const CommunicatorPtr& comm() const { return comms_.global; }

 private:
  CommSet comms_;
  int64_t interval_ms_;
};

}  // namespace bagua
