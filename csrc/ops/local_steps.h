// Local steps with an outer optimizer (local SGD / DiLoCo): each rank runs
// its own optimizer for sync_interval steps without communicating; then the
// pseudo-gradient, how far the weights moved since the last synchronisation,
// is averaged over the ranks and applied to the common anchor by an outer SGD
// with (Nesterov) momentum.
//
// data = this rank's weights after its local optimizer step, in place. State
// (ops/algorithm_step.h), spans initialised with the weights: A = the anchor (the
// weights of the last synchronisation, equal on every rank), M = the outer
// momentum, and with error feedback E = the residual (the initial values of
// M and E are never read: the first outer step starts both from zero).
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
// Compression (compression = a codec of ops/codec.h): the outer steps' average
// of d travels compressed instead of as a float allreduce; the warm-up averages
// stay uncompressed. Dense codecs (minmax_uint8, minmax_uint4, minmax_uint2,
// fp4_e2m1) run the compressed scatter-reduce-gather (ops/compressed_exchange.h;
// every element quantised twice), and the element count must be a multiple of
// the group size (alignment()). Top-k codecs (topk_uint4, topk_uint2; keep
// ceil(topk_density * 256) of each 256 elements, topk_density in (0, 1],
// default 0.02) run the compressed allgather (every element quantised once). With error_feedback (EF-SGD, as
// ops/bytegrad.h), on each rank that quantises (every rank; the node leader when hierarchical), with p its
// pseudo-gradient (A - data; the node's average of it when hierarchical):
//   x = p + E;  E = x - decompress(compress(x))   (E = 0 at the first outer step)
// and the exchange reduces x in place of p. E, the residual of this rank's
// own (first) quantisation, stays on the rank (nothing of it travels) and is
// added to the next synchronisation's p; the second quantisation, of the
// reduced chunk, is not fed back. Hierarchical: other ranks' E stays zero.
// Non-finite pseudo-gradients: every exchange carries NaN and Inf through, so
// after the average every rank checks it and, if it is not finite, puts the
// anchor back into the weights and throws, naming whether its own d held NaN
// or Inf (two device readbacks per outer step).
// Memory: two (three with error feedback) copies of the weights.
//
// Registered as "local_steps"; parameters: sync_interval (int >= 1, 8),
// warmup_steps (int >= 0, 0), outer_lr (number > 0, 0.7), outer_momentum
// (number in [0, 1), 0.9), nesterov (bool, true), hierarchical (bool, false),
// compression (string "none" or a codec name, "none"), error_feedback (bool,
// false; needs compression), topk_density (number in (0, 1], 0.02; top-k
// codecs only).
#pragma once

#include <cstdint>
#include <optional>
#include <string>

#include "ops/algorithm_step.h"
#include "ops/codec.h"

namespace bagua {

// The ranks' average of `data` in place over `comms`: a float allreduce, or the codec's compressed
// exchange with residual `error` (null: none); hierarchical as run_centralized.
void average_over(const CommSet& comms, const std::optional<Codec>& codec, bool hierarchical, const ExecContext& ctx,
                  Span data, const Span* error);

class LocalStepsStep : public Step {
 public:
  LocalStepsStep(CommSet comms, const StepParams& params);
  std::string describe() const override;
  // Compressed with a dense codec: the group size whatever `hierarchical` (as ByteGrad), else 1;
  // times num_fragments (each fragment an equal slice).
  size_t alignment() const override {
    const size_t group = compressed_ && !codec_->sparse() ? static_cast<size_t>(comms_.global->size()) : 1;
    return group * static_cast<size_t>(fragments_);
  }
  void check(DType dtype, size_t count) const override;
  bool communicates(int64_t step) const override;
  // A, M (and E with error feedback).
  int num_state() const override { return error_feedback_ ? 3 : 2; }
  // Throws InvalidArgument: the step needs its state (run_with_state).
  bool run(const ExecContext& ctx, Span data, Span result, int64_t step) const override;
  bool run_with_state(const ExecContext& ctx, Span data, Span result, const std::vector<Span>& state,
                      int64_t step) const override;

 private:
  // The ranks' average of `data`, in place: a float allreduce, or (outer
  // steps of a compressed step) the compressed exchange with residual `error`.
  void average(const ExecContext& ctx, Span data, bool compress, const Span* error) const;
  // Throws, on every rank alike, when the averaged pseudo-gradient `data` holds NaN or Inf (after
  // putting the anchor back into `weights`, or into `data` without it); mine_bad: this rank's own
  // non-finite count.
  void refuse_nonfinite(const ExecContext& ctx, Span data, const Span& anchor, size_t mine_bad,
                        const Span* weights = nullptr) const;
  // Fragment p's offset, and whether it starts an exchange at t = step - warmup + 1.
  int64_t offset(int64_t p) const;
  bool starts(int64_t p, int64_t t) const;
  // One fragment's synchronisation, blocking (overlap_steps = 0); residual.data null without
  // error feedback.
  void sync_now(const ExecContext& ctx, Span data, const Span& anchor, const Span& momentum, const Span& residual,
                bool fresh) const;
  // overlap_steps > 0: launch puts a fragment's pseudo-gradient on the exchange worker; land, at
  // the step `overlap_steps` later, waits for it and applies it.
  std::string flight_bucket(const Span& data, int64_t step) const;
  void launch(const Span& weights, const Span& anchor, const Span& residual, bool fresh, const std::string& key,
              int64_t step) const;
  void land(const ExecContext& ctx, const Span& weights, const Span& anchor, const Span& momentum, const Span& residual,
            bool fresh, const std::string& key, int64_t started) const;
  static constexpr int kCountSlot = 2;  // scratch slots 0 and 1: the exchanges' records
  static constexpr int kMixSlot = 3;

  CommSet comms_;
  int64_t interval_;
  int64_t warmup_;
  double lr_;
  double momentum_;
  bool nesterov_;
  bool hierarchical_;
  std::optional<Codec> codec_;
  bool compressed_;
  int64_t fragments_ = 1;
  int64_t overlap_ = 0;
  double mixing_ = 0.0;
  bool error_feedback_;
};

}  // namespace bagua
