// CUDA kernels of the low-rank step over the element math shared with the
// host loops (ops/low_rank_math.h, kernels/low_rank_cpu.h).
#include <algorithm>
#include <string>
#include <type_traits>

#include <cuda_runtime.h>

#include "common/error.h"
#include "kernels/low_rank_cuda.h"
#include "ops/elementwise.h"
#include "ops/low_rank_math.h"

namespace bagua {
namespace cuda {
namespace {

using low_rank::kDotLanes;
using low_rank::kLanes;
using low_rank::LowRankMath;
using low_rank::OrthMath;

constexpr int kThreads = 256;
constexpr size_t kMaxBlocks = 4096;  // grid-stride loops cover the rest

unsigned int blocks_for(size_t count) {
  return static_cast<unsigned int>(std::min((count + kThreads - 1) / kThreads, kMaxBlocks));
}

template <typename Op>
__global__ void for_each_kernel(size_t count, Op op) {
  const size_t stride = static_cast<size_t>(blockDim.x) * gridDim.x;
  for (size_t i = static_cast<size_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < count; i += stride) op(i);
}

void check_launch(const char* kernel) {
  cudaError_t err = cudaGetLastError();
  if (err != cudaSuccess)
    throw Error(std::string("launching the low-rank ") + kernel + " kernel failed: " + cudaGetErrorName(err) + ": " +
                cudaGetErrorString(err));
}

template <typename Op>
void launch_for_each(const char* kernel, size_t count, Op op, cudaStream_t stream) {
  if (count == 0) return;
  for_each_kernel<Op><<<blocks_for(count), kThreads, 0, stream>>>(count, op);
  check_launch(kernel);
}

template <typename T>
struct FoldOp {
  T* data;
  typename LowRankMath<T>::A* error;
  __device__ void operator()(size_t i) const { LowRankMath<T>::fold_error(data, error, i); }
};

template <typename T>
struct FinishOp {
  const T* data;
  typename LowRankMath<T>::A* error;
  __device__ void operator()(size_t i) const { LowRankMath<T>::finish_error(data, error, i); }
};

template <typename A>
struct InitOp {
  A* q;
  uint64_t key;
  __device__ void operator()(size_t e) const { q[e] = static_cast<A>(low_rank::initial_q(key, e)); }
};

template <typename T>
struct MtpOp {
  const T* M;
  const typename LowRankMath<T>::A* P;
  typename LowRankMath<T>::A* Q;
  size_t n, m, r;
  __device__ void operator()(size_t i) const { Q[i] = LowRankMath<T>::mtp(M, P, n, m, r, i / r, i % r); }
};

template <typename T>
struct PqtOp {
  const typename LowRankMath<T>::A* P;
  const typename LowRankMath<T>::A* Q;
  T* M;
  typename LowRankMath<T>::A* error;  // null without error feedback
  size_t m, r;
  __device__ void operator()(size_t i) const {
    M[i] = LowRankMath<T>::pqt(P, Q, r, i / m, i % m);
    if (error != nullptr) LowRankMath<T>::finish_error(M, error, i);
  }
};

// P = M Q: one warp per element of P, lane = thread of the warp (the lane sum
// of kDotLanes, ops/low_rank_math.h); the tree runs on shuffles, lane l adding
// lane l + s. Every thread of a warp takes the same elements, so the whole
// warp reaches each shuffle.
static_assert(kDotLanes == 32, "P = M Q's lanes are a warp");

template <typename T>
__global__ void mq_kernel(const T* M, const typename LowRankMath<T>::A* Q, typename LowRankMath<T>::A* P, size_t n,
                          size_t m, size_t r) {
  using A = typename LowRankMath<T>::A;
  const size_t thread = static_cast<size_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  const size_t lane = thread % kDotLanes;
  const size_t warps = static_cast<size_t>(blockDim.x) * gridDim.x / kDotLanes;
  for (size_t e = thread / kDotLanes; e < n * r; e += warps) {
    A s = LowRankMath<T>::mq_lane(M, Q, m, r, e / r, e % r, lane);
    for (int d = kDotLanes / 2; d >= 1; d /= 2) s = s + __shfl_down_sync(0xffffffffu, s, d);
    if (lane == 0) P[e] = s;
  }
}

// The host's lane sum of kLanes (kernels/low_rank_cpu.h): lane = thread; every
// thread of the block gets the sum. `lanes` is the block's shared memory.
template <typename A, typename Term>
__device__ A block_tree_sum(A* lanes, size_t rows, Term term) {
  const int l = threadIdx.x;
  A partial = A(0);
  for (size_t x = l; x < rows; x += kLanes) partial = partial + term(x);
  lanes[l] = partial;
  __syncthreads();
  for (int s = kLanes / 2; s >= 1; s /= 2) {
    if (l < s) lanes[l] = lanes[l] + lanes[l + s];
    __syncthreads();
  }
  const A sum = lanes[0];
  __syncthreads();
  return sum;
}

template <typename A>
__global__ void orthogonalize_kernel(A* mat, size_t rows, size_t cols, A epsilon) {
  __shared__ A lanes[kLanes];
  const int l = threadIdx.x;
  for (size_t i = 0; i < cols; ++i) {
    const A divisor = OrthMath<A>::divisor(
        block_tree_sum(lanes, rows, [&](size_t x) { return mat[x * cols + i] * mat[x * cols + i]; }), epsilon);
    for (size_t x = l; x < rows; x += kLanes) mat[x * cols + i] = OrthMath<A>::normalize(mat[x * cols + i], divisor);
    __syncthreads();
    for (size_t c = i + 1; c < cols; ++c) {
      const A dot = block_tree_sum(lanes, rows, [&](size_t x) { return mat[x * cols + i] * mat[x * cols + c]; });
      for (size_t x = l; x < rows; x += kLanes)
        mat[x * cols + c] = OrthMath<A>::project(mat[x * cols + c], dot, mat[x * cols + i]);
      __syncthreads();
    }
  }
}

}  // namespace

void launch_low_rank_fold_error(void* data, void* error, size_t count, DType dtype, cudaStream_t stream) {
  with_floating(dtype, "low-rank error feedback", [&](auto* tag) {
    using T = std::remove_pointer_t<decltype(tag)>;
    using A = typename LowRankMath<T>::A;
    launch_for_each("error feedback", count, FoldOp<T>{static_cast<T*>(data), static_cast<A*>(error)}, stream);
  });
}

void launch_low_rank_finish_error(const void* data, void* error, size_t count, DType dtype, cudaStream_t stream) {
  with_floating(dtype, "low-rank error feedback", [&](auto* tag) {
    using T = std::remove_pointer_t<decltype(tag)>;
    using A = typename LowRankMath<T>::A;
    launch_for_each("error feedback", count, FinishOp<T>{static_cast<const T*>(data), static_cast<A*>(error)}, stream);
  });
}

void launch_low_rank_initial_q(void* q, size_t count, DType compute, uint64_t key, cudaStream_t stream) {
  with_compute_dtype(compute, "low rank", [&](auto* tag) {
    using A = std::remove_pointer_t<decltype(tag)>;
    launch_for_each("initial Q", count, InitOp<A>{static_cast<A*>(q), key}, stream);
  });
}

void launch_low_rank_orthogonalize(void* mat, size_t rows, size_t cols, DType compute, double epsilon,
                                   cudaStream_t stream) {
  if (rows == 0 || cols == 0) return;
  with_compute_dtype(compute, "low rank", [&](auto* tag) {
    using A = std::remove_pointer_t<decltype(tag)>;
    orthogonalize_kernel<A><<<1, kLanes, 0, stream>>>(static_cast<A*>(mat), rows, cols, static_cast<A>(epsilon));
    check_launch("orthogonalisation");
  });
}

void launch_low_rank_mq(void* M, size_t n, size_t m, const void* Q, size_t r, void* P, DType dtype, void* error,
                        cudaStream_t stream) {
  if (error != nullptr) launch_low_rank_fold_error(M, error, n * m, dtype, stream);
  with_floating(dtype, "low-rank compression", [&](auto* tag) {
    using T = std::remove_pointer_t<decltype(tag)>;
    using A = typename LowRankMath<T>::A;
    if (n * r == 0) return;
    mq_kernel<T><<<blocks_for(n * r * kDotLanes), kThreads, 0, stream>>>(
        static_cast<const T*>(M), static_cast<const A*>(Q), static_cast<A*>(P), n, m, r);
    check_launch("P = M Q");
  });
}

void launch_low_rank_mtp(const void* M, size_t n, size_t m, const void* P, size_t r, void* Q, DType dtype,
                         cudaStream_t stream) {
  with_floating(dtype, "low-rank compression", [&](auto* tag) {
    using T = std::remove_pointer_t<decltype(tag)>;
    using A = typename LowRankMath<T>::A;
    launch_for_each("Q = M^T P", m * r,
                    MtpOp<T>{static_cast<const T*>(M), static_cast<const A*>(P), static_cast<A*>(Q), n, m, r}, stream);
  });
}

void launch_low_rank_pqt(const void* P, const void* Q, size_t n, size_t m, size_t r, void* M, DType dtype, void* error,
                         cudaStream_t stream) {
  with_floating(dtype, "low-rank decompression", [&](auto* tag) {
    using T = std::remove_pointer_t<decltype(tag)>;
    using A = typename LowRankMath<T>::A;
    launch_for_each(
        "M = P Q^T", n * m,
        PqtOp<T>{static_cast<const A*>(P), static_cast<const A*>(Q), static_cast<T*>(M), static_cast<A*>(error), m, r},
        stream);
  });
}

}  // namespace cuda
}  // namespace bagua
