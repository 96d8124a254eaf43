// ByteGrad's step: the MinMaxUInt8 compressed scatter-reduce-gather
// (ops/compressed_exchange.h) of float data, in place. The element count must
// be a multiple of the group size: the exchange splits it into one chunk per
// rank, or per node when hierarchical (intra-node reduce to the leader, the
// exchange among leaders, intra-node broadcast).
//
// Error feedback (error_feedback=true; EF-SGD): the step keeps one state span
// e, the data's size and dtype, zero at bind (Step::state_init). Each run, on
// the rank that quantises (every rank; the node leader when hierarchical),
// before the exchange compresses the data x:
//   x <- x + e;  e <- x - decompress(compress(x))
// with the exchange's own chunks and records (one per rank of the exchange).
// e is thus the residual of this rank's first (local) quantisation only, and
// stays rank-local: nothing of it travels. The second quantisation, of the
// reduced chunk before the allgather, is not fed back. Hierarchical: e holds
// the residual of the leader's node average; other ranks' e stays zero.
// Cost: one element of the data's dtype per bucket element. Without error
// feedback the step is stateless and its bytes and values are unchanged.
//
// Registered as "bytegrad"; parameters: hierarchical (bool, false), average
// (bool, true), error_feedback (bool, false).
#pragma once

#include "ops/algorithm_step.h"

namespace bagua {

class ByteGradStep : public Step {
 public:
  ByteGradStep(CommSet comms, const StepParams& params);
  std::string describe() const override;
  // The group size whatever `hierarchical` (a multiple of the node count),
  // so a bucket laid out for one mode serves the other.
  size_t alignment() const override { return static_cast<size_t>(comms_.global->size()); }
  void check(DType dtype, size_t count) const override;
  int num_state() const override { return error_feedback_ ? 1 : 0; }
  StateInit state_init() const override { return StateInit::kZero; }
  // Throws InvalidArgument with error feedback: it needs its residual (run_with_state).
  bool run(const ExecContext& ctx, Span data, Span result, int64_t step) const override;
  bool run_with_state(const ExecContext& ctx, Span data, Span result, const std::vector<Span>& state,
                      int64_t step) const override;

 private:
  CommSet comms_;
  bool hierarchical_;
  bool average_;
  bool error_feedback_;
};

}  // namespace bagua
