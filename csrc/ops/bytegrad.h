// ByteGrad's step (§2.2): the MinMaxUInt8 compressed scatter-reduce-gather
// (ops/compressed_exchange.h) of float data, in place. The element count must
// be a multiple of the group size: the exchange splits it into one chunk per
// rank, or per node when hierarchical (intra-node reduce to the leader, the
// exchange among leaders, intra-node broadcast).
//
// Registered as "bytegrad"; parameters: hierarchical (bool, false), average
// (bool, true).
#pragma once

#include "ops/step.h"

namespace bagua {

class ByteGradStep : public Step {
 public:
  ByteGradStep(CommSet comms, const StepParams& params);
  std::string describe() const override;
  // The group size whatever `hierarchical` (a multiple of the node count),
  // so a bucket laid out for one mode serves the other.
  size_t alignment() const override { return static_cast<size_t>(comms_.global->size()); }
  void check(DType dtype, size_t count) const override;
  bool run(const ExecContext& ctx, Span data, Span result, int64_t step) const override;

 private:
  CommSet comms_;
  bool hierarchical_;
  bool average_;
};

}  // namespace bagua
