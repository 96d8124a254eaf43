// GradientAllReduce's step: every rank's data becomes the sum or the
// mean over the group, in place. Hierarchical: intra-node reduce to the node
// leader, allreduce among leaders, intra-node broadcast.
//
// Registered as "centralized_allreduce"; parameters: hierarchical (bool,
// false), average (bool, true).
#pragma once

#include "ops/algorithm_step.h"

namespace bagua {

class CentralizedAllreduceStep : public Step {
 public:
  CentralizedAllreduceStep(CommSet comms, const StepParams& params);
  std::string describe() const override;
  bool run(const ExecContext& ctx, Span data, Span result, int64_t step) const override;
  // Flat: one allreduce on the global communicator.
  bool predict_calls(const Communicator& comm, Span data, int64_t step, std::vector<OpDesc>* calls) const override;

 private:
  CommSet comms_;
  bool hierarchical_;
  bool average_;
};

}  // namespace bagua
