#include "ops/low_rank_kernels.h"

#include <string>
#include <type_traits>

#include "common/error.h"
#include "ops/dispatch.h"
#include "ops/elementwise.h"
#include "ops/low_rank_math.h"
#ifdef BAGUA_WITH_CUDA
#include "kernels/low_rank_cuda.h"
#endif

namespace bagua {
namespace step_kernels {
namespace {

using low_rank::LowRankMath;
using low_rank::OrthMath;

// Calls f(A*) with A the compute type of `compute` (float32 or float64).
template <typename F>
void with_compute(DType compute, const char* what, F&& f) {
  switch (compute) {
    case DType::kFloat32: return f(static_cast<float*>(nullptr));
    case DType::kFloat64: return f(static_cast<double*>(nullptr));
    default: throw InvalidArgument(std::string(what) + ": the compute dtype must be float32 or float64, got " +
                                   dtype_name(compute));
  }
}

// The fixed-order sum of term(x) over x < rows (ops/low_rank_math.h).
template <typename A, typename Term>
A lane_tree_sum(size_t rows, Term&& term) {
  A lanes[low_rank::kLanes];
  for (int l = 0; l < low_rank::kLanes; ++l) lanes[l] = A(0);
  for (size_t x = 0; x < rows; ++x) lanes[x % low_rank::kLanes] = lanes[x % low_rank::kLanes] + term(x);
  for (int s = low_rank::kLanes / 2; s >= 1; s /= 2)
    for (int l = 0; l < s; ++l) lanes[l] = lanes[l] + lanes[l + s];
  return lanes[0];
}

template <typename A>
void orthogonalize_loop(A* mat, size_t rows, size_t cols, A epsilon) {
  for (size_t i = 0; i < cols; ++i) {
    const A divisor = OrthMath<A>::divisor(
        lane_tree_sum<A>(rows, [&](size_t x) { return mat[x * cols + i] * mat[x * cols + i]; }), epsilon);
    for (size_t x = 0; x < rows; ++x) mat[x * cols + i] = OrthMath<A>::normalize(mat[x * cols + i], divisor);
    for (size_t c = i + 1; c < cols; ++c) {
      const A dot = lane_tree_sum<A>(rows, [&](size_t x) { return mat[x * cols + i] * mat[x * cols + c]; });
      for (size_t x = 0; x < rows; ++x) mat[x * cols + c] = OrthMath<A>::project(mat[x * cols + c], dot, mat[x * cols + i]);
    }
  }
}

}  // namespace

DType low_rank_compute_dtype(DType dtype) {
  if (!is_floating(dtype))
    throw InvalidArgument(std::string("low-rank compression needs a floating dtype, got ") + dtype_name(dtype));
  return dtype == DType::kFloat64 ? DType::kFloat64 : DType::kFloat32;
}

void low_rank_fold_error(const ExecContext& ctx, void* data, void* error, size_t count, DType dtype) {
  if (count == 0) return;
  on_device(
      ctx, "low-rank error feedback",
      [=] {
        with_floating(dtype, "low-rank error feedback", [&](auto* tag) {
          using T = std::remove_pointer_t<decltype(tag)>;
          using A = typename LowRankMath<T>::A;
          for (size_t i = 0; i < count; ++i)
            LowRankMath<T>::fold_error(static_cast<T*>(data), static_cast<A*>(error), i);
        });
      },
      BAGUA_CUDA_LAUNCH(cuda::launch_low_rank_fold_error(data, error, count, dtype, stream)));
}

void low_rank_finish_error(const ExecContext& ctx, const void* data, void* error, size_t count, DType dtype) {
  if (count == 0) return;
  on_device(
      ctx, "low-rank error feedback",
      [=] {
        with_floating(dtype, "low-rank error feedback", [&](auto* tag) {
          using T = std::remove_pointer_t<decltype(tag)>;
          using A = typename LowRankMath<T>::A;
          for (size_t i = 0; i < count; ++i)
            LowRankMath<T>::finish_error(static_cast<const T*>(data), static_cast<A*>(error), i);
        });
      },
      BAGUA_CUDA_LAUNCH(cuda::launch_low_rank_finish_error(data, error, count, dtype, stream)));
}

void low_rank_initial_q(const ExecContext& ctx, void* q, size_t count, DType compute, uint64_t key) {
  if (count == 0) return;
  on_device(
      ctx, "the initial Q",
      [=] {
        with_compute(compute, "the initial Q", [&](auto* tag) {
          using A = std::remove_pointer_t<decltype(tag)>;
          for (size_t e = 0; e < count; ++e) static_cast<A*>(q)[e] = static_cast<A>(low_rank::initial_q(key, e));
        });
      },
      BAGUA_CUDA_LAUNCH(cuda::launch_low_rank_initial_q(q, count, compute, key, stream)));
}

void low_rank_orthogonalize(const ExecContext& ctx, void* mat, size_t rows, size_t cols, DType compute,
                            double epsilon) {
  if (rows == 0 || cols == 0) return;
  on_device(
      ctx, "orthogonalisation",
      [=] {
        with_compute(compute, "orthogonalisation", [&](auto* tag) {
          using A = std::remove_pointer_t<decltype(tag)>;
          orthogonalize_loop(static_cast<A*>(mat), rows, cols, static_cast<A>(epsilon));
        });
      },
      BAGUA_CUDA_LAUNCH(cuda::launch_low_rank_orthogonalize(mat, rows, cols, compute, epsilon, stream)));
}

void low_rank_mq(const ExecContext& ctx, const void* M, size_t n, size_t m, const void* Q, size_t r, void* P,
                 DType dtype) {
  if (n == 0 || r == 0) return;
  on_device(
      ctx, "low-rank compression",
      [=] {
        with_floating(dtype, "low-rank compression", [&](auto* tag) {
          using T = std::remove_pointer_t<decltype(tag)>;
          using A = typename LowRankMath<T>::A;
          const T* Mt = static_cast<const T*>(M);
          const A* Qa = static_cast<const A*>(Q);
          A* Pa = static_cast<A*>(P);
          for (size_t a = 0; a < n; ++a)
            for (size_t k = 0; k < r; ++k) Pa[a * r + k] = LowRankMath<T>::mq(Mt, Qa, m, r, a, k);
        });
      },
      BAGUA_CUDA_LAUNCH(cuda::launch_low_rank_mq(M, n, m, Q, r, P, dtype, stream)));
}

void low_rank_mtp(const ExecContext& ctx, const void* M, size_t n, size_t m, const void* P, size_t r, void* Q,
                  DType dtype) {
  if (m == 0 || r == 0) return;
  on_device(
      ctx, "low-rank compression",
      [=] {
        with_floating(dtype, "low-rank compression", [&](auto* tag) {
          using T = std::remove_pointer_t<decltype(tag)>;
          using A = typename LowRankMath<T>::A;
          const T* Mt = static_cast<const T*>(M);
          const A* Pa = static_cast<const A*>(P);
          A* Qa = static_cast<A*>(Q);
          for (size_t j = 0; j < m; ++j)
            for (size_t k = 0; k < r; ++k) Qa[j * r + k] = LowRankMath<T>::mtp(Mt, Pa, n, m, r, j, k);
        });
      },
      BAGUA_CUDA_LAUNCH(cuda::launch_low_rank_mtp(M, n, m, P, r, Q, dtype, stream)));
}

void low_rank_pqt(const ExecContext& ctx, const void* P, const void* Q, size_t n, size_t m, size_t r, void* M,
                  DType dtype) {
  if (n == 0 || m == 0) return;
  on_device(
      ctx, "low-rank decompression",
      [=] {
        with_floating(dtype, "low-rank decompression", [&](auto* tag) {
          using T = std::remove_pointer_t<decltype(tag)>;
          using A = typename LowRankMath<T>::A;
          const A* Pa = static_cast<const A*>(P);
          const A* Qa = static_cast<const A*>(Q);
          T* Mt = static_cast<T*>(M);
          for (size_t a = 0; a < n; ++a)
            for (size_t j = 0; j < m; ++j) Mt[a * m + j] = LowRankMath<T>::pqt(Pa, Qa, m, r, a, j);
        });
      },
      BAGUA_CUDA_LAUNCH(cuda::launch_low_rank_pqt(P, Q, n, m, r, M, dtype, stream)));
}

}  // namespace step_kernels
}  // namespace bagua
