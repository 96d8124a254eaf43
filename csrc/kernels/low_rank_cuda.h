// CUDA launchers of the low-rank step's arithmetic (ops/low_rank_kernels.h),
// whose reference is the host loops of kernels/low_rank_cpu.h: the same
// element math of ops/low_rank_math.h, the same summation orders, the same
// bits. Plain C++; asynchronous on `stream`; pointers are device memory;
// launch failures throw bagua::Error. P = M Q runs one warp per element of P;
// the other element kernels one thread per output element; the
// orthogonalisation one block of low_rank::kLanes threads.
#pragma once

#include <cstddef>
#include <cstdint>

#include <cuda_runtime_api.h>

#include "common/dtype.h"

namespace bagua {
namespace cuda {

void launch_low_rank_fold_error(void* data, void* error, size_t count, DType dtype, cudaStream_t stream);
void launch_low_rank_finish_error(const void* data, void* error, size_t count, DType dtype, cudaStream_t stream);
void launch_low_rank_initial_q(void* q, size_t count, DType compute, uint64_t key, cudaStream_t stream);
void launch_low_rank_orthogonalize(void* mat, size_t rows, size_t cols, DType compute, double epsilon,
                                   cudaStream_t stream);
// With `error` (not null): the fold of error feedback on M first.
void launch_low_rank_mq(void* M, size_t n, size_t m, const void* Q, size_t r, void* P, DType dtype, void* error,
                        cudaStream_t stream);
void launch_low_rank_mtp(const void* M, size_t n, size_t m, const void* P, size_t r, void* Q, DType dtype,
                         cudaStream_t stream);
// With `error`: the finish of error feedback on each element of M as it is written.
void launch_low_rank_pqt(const void* P, const void* Q, size_t n, size_t m, size_t r, void* M, DType dtype, void* error,
                         cudaStream_t stream);

}  // namespace cuda
}  // namespace bagua
