// Low-rank compressed gradient averaging: PowerSGD (Vogels et al. 2019) as
// torch's DDP hook torch.distributed.algorithms.ddp_comm_hooks.powerSGD_hook
// runs it, one power iteration per step with warm start and error feedback.
// In place on one bucket of gradients; it needs the bucket's layout (ops/algorithm_step.h).
//
// Which tensors are compressed (torch's rule): a tensor of >= 2 dimensions is
// the n x m matrix M (n = shape[0], m = numel / n), of rank r = min(n, m,
// rank); it is compressed when (n + m) * r * min_compression_rate < n * m.
// The others (1-D tensors, scalars, matrices whose compression would not pay)
// travel uncompressed. (Torch's hook also views 1-D tensors as n x 1
// matrices, which its rule compresses only for min_compression_rate < 1;
// here they always travel uncompressed.)
//
// Step number s (0-based):
//   s < start_iter: the bucket is allreduced (mean over the group), as torch's
//     first start_powerSGD_iter iterations;
//   after: with error_feedback, data += error and error <- that input (every
//     tensor; the matrices' in the pass of P = M Q over them); the
//     uncompressed tensors are allreduced (mean) in one call (gathered into
//     one buffer unless they lie next to each other); for each compressed
//     matrix, in bucket order, Q (m x r) <- the initial Q if s == start_iter
//     or without warm_start (seeded: ops/low_rank_math.h, key (seed, s, the
//     tensor's index in the bucket)), else last step's averaged Q; Q <-
//     orthogonalised; P = M Q; all P allreduced (sum, one call); each P
//     orthogonalised; Q = M^T P; all Q allreduced (mean, one call); M <- P
//     Q^T. With error_feedback, error <- input - data (every tensor, the
//     matrices' in the pass of M <- P Q^T: uncompressed tensors keep their
//     distance to the mean, as torch's hook).
// Orthogonalisation is modified Gram-Schmidt on the columns (torch's hook
// uses it for rank <= 2 and 16-bit data, else a QR factorisation, whose
// columns may differ in sign: P Q^T is the same), dividing each column by its
// norm + orthogonalization_epsilon; a zero column stays zero.
//
// Arithmetic: float32 for float32, float16 and bfloat16 data (float64 for
// float64): the error memory, P and Q are of that compute type, so 16-bit
// gradients are orthogonalised and communicated (P, Q) in float32; the
// uncompressed tensors and the result are in the data's dtype. Element math:
// ops/low_rank_math.h, host loops and CUDA kernels: ops/low_rank_kernels.h.
// All of it is streaming work, O(bucket) for a fixed rank: each matrix is
// read twice (P = M Q with the fold, Q = M^T P) and written once (M <- P Q^T
// with the finish).
//
// State (one block of the compute type, zeros at first, Step::state_layout):
// the error memory (the bucket's element count; absent without
// error_feedback), then each compressed matrix's Q (m * r elements, bucket
// order). Scratch: all P (sum of n * r) and the gathered uncompressed tensors.
//
// Registered as "low_rank"; parameters: rank (int >= 1, 4), start_iter (int
// >= 0, 1000), min_compression_rate (decimal string >= 0, "2"),
// orthogonalization_epsilon (decimal string >= 0, "0"), error_feedback (bool,
// true), warm_start (bool, true), seed (int >= 0, 0).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "ops/algorithm_step.h"

namespace bagua {

class LowRankStep : public Step {
 public:
  LowRankStep(CommSet comms, const StepParams& params, BucketLayout layout = {});
  std::string describe() const override;
  void check(DType dtype, size_t count) const override;
  int num_state() const override { return 1; }
  StateLayout state_layout(DType dtype, size_t count) const override;
  bool run(const ExecContext& ctx, Span data, Span result, int64_t step) const override;
  bool run_with_state(const ExecContext& ctx, Span data, Span result, const std::vector<Span>& state,
                      int64_t step) const override;

  // One tensor of the layout as the step treats it.
  struct Part {
    size_t tensor;  // index in the layout
    size_t offset, numel;
    bool compressed;
    size_t n, m, r;             // compressed matrices only
    size_t p_offset, q_offset;  // in all P, in all Q (compressed only)
  };
  const std::vector<Part>& parts() const { return parts_; }

 private:
  CommSet comms_;
  BucketLayout layout_;
  int64_t rank_;
  int64_t start_iter_;
  double min_compression_rate_;
  std::string min_compression_rate_text_;
  double epsilon_;
  std::string epsilon_text_;
  bool error_feedback_;
  bool warm_start_;
  int64_t seed_;
  std::vector<Part> parts_;
  // The uncompressed tensors as runs of adjacent ones (one allreduce in place when there is one run).
  struct Run {
    size_t offset, numel;
  };
  std::vector<Run> runs_;
  size_t p_count_ = 0, q_count_ = 0, uncompressed_count_ = 0;
};

}  // namespace bagua
