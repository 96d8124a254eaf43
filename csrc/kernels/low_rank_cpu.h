// Host loops of the low-rank step (ops/low_rank.h) over the element math and
// summation orders of ops/low_rank_math.h: the reference the CUDA launchers of
// kernels/low_rank_cuda.h match bit for bit. Single-threaded, synchronous,
// plain host memory. `dtype` is the data's (float32, float64, float16,
// bfloat16); the error memory, P and Q are of its compute type (float32, or
// float64 for float64 data; `compute` where only those are involved). Bad
// dtypes throw InvalidArgument. Ranks r are >= 1.
//
// Speed: each product streams M once, row by row, in vectorised loops
// compiled once per instruction set (kernels/cpu_isa.h; every copy gives the
// same bits): P = M Q keeps kDotLanes accumulators per element in registers
// while the row is in L1 (error feedback's fold goes in the same pass); Q =
// M^T P adds four rows at a time into the sums of an L1-sized block of
// columns; M = P Q^T writes each row block once (the finish of error feedback
// in the same pass).
// Temporaries (a transposed Q, sums) are per thread and grow only, so
// steady-state steps allocate nothing.
#pragma once

#include <cstddef>
#include <cstdint>

#include "common/dtype.h"

namespace bagua {
namespace low_rank {

// data[i] <- data[i] + error[i] (rounded to the data's type); error[i] <- data[i].
void fold_error_cpu(void* data, void* error, size_t count, DType dtype);
// error[i] <- error[i] - data[i].
void finish_error_cpu(const void* data, void* error, size_t count, DType dtype);
// q[e] <- the initial Q's element e for `key`, e < count.
void initial_q_cpu(void* q, size_t count, DType compute, uint64_t key);
// Modified Gram-Schmidt of the columns of the rows x cols matrix `mat` (row-major).
void orthogonalize_cpu(void* mat, size_t rows, size_t cols, DType compute, double epsilon);
// P = M Q (M: n x m of `dtype`; Q: m x r; P: n x r). With `error` (M's error memory, n x m):
// fold_error on M first, row by row as the product reads it.
void mq_cpu(void* M, size_t n, size_t m, const void* Q, size_t r, void* P, DType dtype, void* error);
// Q = M^T P.
void mtp_cpu(const void* M, size_t n, size_t m, const void* P, size_t r, void* Q, DType dtype);
// M = P Q^T, rounded to `dtype`. With `error`: finish_error on M after, row by row as it is written.
void pqt_cpu(const void* P, const void* Q, size_t n, size_t m, size_t r, void* M, DType dtype, void* error);

}  // namespace low_rank
}  // namespace bagua
