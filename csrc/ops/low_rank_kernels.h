// The low-rank step's arithmetic (ops/low_rank.h), dispatched on the
// context's device like ops/kernels.h (ops/dispatch.h): the host loops of
// kernels/low_rank_cpu.h on CPU (enqueued on the stream of a host Device), the
// launchers of kernels/low_rank_cuda.h on CUDA (enqueued on the context's
// stream; the same bits). Both follow the element math and summation orders
// of ops/low_rank_math.h. `dtype` is the data's (float32, float64, float16,
// bfloat16); the error memory, P and Q are of its compute type
// (low_rank_compute_dtype: float32, or float64 for float64 data).
#pragma once

#include <cstddef>
#include <cstdint>

#include "ops/algorithm_step.h"

namespace bagua {
namespace step_kernels {

// float32, or float64 for float64 data; InvalidArgument for non-floating dtypes.
DType low_rank_compute_dtype(DType dtype);

// data[i] <- data[i] + error[i] (rounded to the data's type); error[i] <- data[i].
void low_rank_fold_error(const ExecContext& ctx, void* data, void* error, size_t count, DType dtype);
// error[i] <- error[i] - data[i].
void low_rank_finish_error(const ExecContext& ctx, const void* data, void* error, size_t count, DType dtype);
// q[e] <- the initial Q's element e for `key` (ops/low_rank_math.h), e < count; q of `compute` dtype.
void low_rank_initial_q(const ExecContext& ctx, void* q, size_t count, DType compute, uint64_t key);
// Modified Gram-Schmidt of the columns of the rows x cols matrix `mat` (row-major, `compute` dtype).
void low_rank_orthogonalize(const ExecContext& ctx, void* mat, size_t rows, size_t cols, DType compute, double epsilon);
// P = M Q (M: n x m of `dtype`; Q: m x r, P: n x r of its compute dtype; r >= 1). With `error`
// (M's error memory, n x m, or null): low_rank_fold_error on M first (the host fuses it into the
// product's pass over M).
void low_rank_mq(const ExecContext& ctx, void* M, size_t n, size_t m, const void* Q, size_t r, void* P, DType dtype,
                 void* error = nullptr);
// Q = M^T P.
void low_rank_mtp(const ExecContext& ctx, const void* M, size_t n, size_t m, const void* P, size_t r, void* Q,
                  DType dtype);
// M = P Q^T, rounded to `dtype`. With `error`: low_rank_finish_error on M after (fused on the host).
void low_rank_pqt(const ExecContext& ctx, const void* P, const void* Q, size_t n, size_t m, size_t r, void* M,
                  DType dtype, void* error = nullptr);

}  // namespace step_kernels
}  // namespace bagua
