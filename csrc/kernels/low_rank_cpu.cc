// Host loops of the low-rank step (kernels/low_rank_cpu.h): dtype dispatch, per-thread temporaries
// and the transposes around the loops of low_rank_cpu_loops.inc, which are compiled once per
// instruction set and chosen per matrix (kernels/cpu_isa.h). No a*b+c is contracted into an FMA
// (CMakeLists.txt), as in the CUDA kernels.
#include "kernels/low_rank_cpu.h"

#include <algorithm>
#include <string>
#include <type_traits>
#include <vector>

#include "common/error.h"
#include "kernels/cpu_isa.h"
#include "ops/elementwise.h"
#include "ops/low_rank_math.h"

namespace bagua {
namespace low_rank {
namespace {

// Accumulators of Q = M^T P: r x (a block of columns) that stays in L1, updated by kMtpRows rows of M
// at a time.
constexpr size_t kMtpBlockBytes = 16 << 10;
constexpr size_t kMtpRows = 4;
// Row block of M = P Q^T: its sums stay in L1.
constexpr size_t kPqtBlock = 2048;

#define BAGUA_ISA_LOOPS "kernels/low_rank_cpu_loops.inc"
#include "kernels/cpu_isa_copies.h"

// Per-thread temporaries, one per slot and compute type; they only grow.
enum Slot { kTransposed = 0, kRow = 1, kAcc = 2, kSlots = 3 };
template <typename A>
A* temporary(Slot slot, size_t count) {
  thread_local std::vector<A> buffers[kSlots];
  std::vector<A>& b = buffers[slot];
  if (b.size() < count) b.resize(count);
  return b.data();
}

// The rows x cols matrix src (row-major) transposed into dst (cols x rows).
template <typename A>
void transpose(const A* src, size_t rows, size_t cols, A* dst) {
  for (size_t i = 0; i < rows; ++i)
    for (size_t k = 0; k < cols; ++k) dst[k * rows + i] = src[i * cols + k];
}

// Q (m x r) transposed: Q itself when r is 1.
template <typename A>
const A* transposed_q(const A* Q, size_t m, size_t r) {
  if (r == 1) return Q;
  A* t = temporary<A>(kTransposed, m * r);
  transpose(Q, m, r, t);
  return t;
}

// A row of M in the compute type: only 16-bit data needs the buffer.
template <typename T, typename A>
A* row_buffer(size_t len) {
  return std::is_same<T, A>::value ? nullptr : temporary<A>(kRow, len);
}

// The loops of the ISA in use, by name (BAGUA_ISA_CALL needs deduced template arguments).
template <typename T, typename A>
void fold_error_loop(T* data, A* error, size_t count) {
  BAGUA_ISA_CALL(fold_error, data, error, count)
}
template <typename T, typename A>
void finish_error_loop(const T* data, A* error, size_t count) {
  BAGUA_ISA_CALL(finish_error, data, error, count)
}
template <typename A>
void orthogonalize_loop(A* cm, size_t rows, size_t cols, A epsilon) {
  BAGUA_ISA_CALL(orthogonalize_columns, cm, rows, cols, epsilon)
}
template <typename T, typename A>
void mq_loop(T* M, size_t n, size_t m, const A* Qt, size_t r, A* P, A* row, A* error) {
  BAGUA_ISA_CALL(mq, M, n, m, Qt, r, P, row, error)
}
template <typename T, typename A>
void mtp_loop(const T* M, size_t n, size_t m, size_t j0, size_t w, const A* P, size_t r, A* acc, A* rows) {
  BAGUA_ISA_CALL(mtp_block, M, n, m, j0, w, P, r, acc, rows)
}
template <typename T, typename A>
void pqt_loop(const A* P, const A* Qt, size_t n, size_t m, size_t r, T* M, A* acc, A* error) {
  BAGUA_ISA_CALL(pqt, P, Qt, n, m, r, M, acc, error)
}

}  // namespace

void fold_error_cpu(void* data, void* error, size_t count, DType dtype) {
  with_floating(dtype, "low-rank error feedback", [&](auto* tag) {
    using T = std::remove_pointer_t<decltype(tag)>;
    using A = typename LowRankMath<T>::A;
    fold_error_loop(static_cast<T*>(data), static_cast<A*>(error), count);
  });
}

void finish_error_cpu(const void* data, void* error, size_t count, DType dtype) {
  with_floating(dtype, "low-rank error feedback", [&](auto* tag) {
    using T = std::remove_pointer_t<decltype(tag)>;
    using A = typename LowRankMath<T>::A;
    finish_error_loop(static_cast<const T*>(data), static_cast<A*>(error), count);
  });
}

void initial_q_cpu(void* q, size_t count, DType compute, uint64_t key) {
  with_compute_dtype(compute, "the initial Q", [&](auto* tag) {
    using A = std::remove_pointer_t<decltype(tag)>;
    for (size_t e = 0; e < count; ++e) static_cast<A*>(q)[e] = static_cast<A>(initial_q(key, e));
  });
}

void orthogonalize_cpu(void* mat, size_t rows, size_t cols, DType compute, double epsilon) {
  if (rows == 0 || cols == 0) return;
  with_compute_dtype(compute, "orthogonalisation", [&](auto* tag) {
    using A = std::remove_pointer_t<decltype(tag)>;
    A* rm = static_cast<A*>(mat);
    if (cols == 1) return orthogonalize_loop(rm, rows, cols, static_cast<A>(epsilon));  // one column: contiguous
    A* cm = temporary<A>(kTransposed, rows * cols);
    transpose(rm, rows, cols, cm);
    orthogonalize_loop(cm, rows, cols, static_cast<A>(epsilon));
    transpose(cm, cols, rows, rm);
  });
}

void mq_cpu(void* M, size_t n, size_t m, const void* Q, size_t r, void* P, DType dtype, void* error) {
  if (n == 0) return;
  with_floating(dtype, "low-rank compression", [&](auto* tag) {
    using T = std::remove_pointer_t<decltype(tag)>;
    using A = typename LowRankMath<T>::A;
    mq_loop(static_cast<T*>(M), n, m, transposed_q(static_cast<const A*>(Q), m, r), r, static_cast<A*>(P),
            error != nullptr ? nullptr : row_buffer<T, A>(m), static_cast<A*>(error));
  });
}

void mtp_cpu(const void* M, size_t n, size_t m, const void* P, size_t r, void* Q, DType dtype) {
  if (m == 0) return;
  with_floating(dtype, "low-rank compression", [&](auto* tag) {
    using T = std::remove_pointer_t<decltype(tag)>;
    using A = typename LowRankMath<T>::A;
    const size_t block = std::max<size_t>(kDotLanes, kMtpBlockBytes / (std::max<size_t>(r, 1) * sizeof(A)));
    A* acc = temporary<A>(kAcc, r * block);
    A* rows = row_buffer<T, A>(kMtpRows * block);
    A* q = static_cast<A*>(Q);
    for (size_t j0 = 0; j0 < m; j0 += block) {
      const size_t w = std::min(block, m - j0);
      mtp_loop(static_cast<const T*>(M), n, m, j0, w, static_cast<const A*>(P), r, acc, rows);
      for (size_t j = 0; j < w; ++j)
        for (size_t k = 0; k < r; ++k) q[(j0 + j) * r + k] = acc[k * w + j];
    }
  });
}

void pqt_cpu(const void* P, const void* Q, size_t n, size_t m, size_t r, void* M, DType dtype, void* error) {
  if (n == 0 || m == 0) return;
  with_floating(dtype, "low-rank decompression", [&](auto* tag) {
    using T = std::remove_pointer_t<decltype(tag)>;
    using A = typename LowRankMath<T>::A;
    const A* qt = transposed_q(static_cast<const A*>(Q), m, r);
    pqt_loop(static_cast<const A*>(P), qt, n, m, r, static_cast<T*>(M), temporary<A>(kAcc, kPqtBlock),
             static_cast<A*>(error));
  });
}

}  // namespace low_rank
}  // namespace bagua
