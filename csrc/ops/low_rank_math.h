// Element math of the low-rank step (ops/low_rank.h), written once for the
// host loops (kernels/low_rank_cpu.h) and the CUDA kernels
// (kernels/low_rank_cuda.h), which therefore give the same bits (neither
// side contracts a * b + c into an FMA; sqrt and division are IEEE-rounded on
// both; NaN payloads aside).
//
// T is the data's element type; A, the compute type, is float (double for
// float64 data): float16 and bfloat16 gradients are read into float32 and
// every product, sum, norm and the P and Q matrices stay in float32.
//
// Matrices are row-major: M is n x m (the tensor viewed as shape[0] x the
// rest), P is n x r, Q is m x r, element (i, k) of an R x r matrix at i*r + k.
//
// Every sum is a chain of madd steps (s + x * y, the product rounded, then
// the sum) in one fixed order both sides follow:
// * lane sums of L lanes: lane l adds the terms l, l + L, l + 2L, ... in
//   ascending order, from zero; then a pairwise tree (for s = L/2, ..., 1:
//   lane l += lane l + s) gives lane 0. The orthogonalisation's sums (column
//   norms, dot products over a column's rows) are lane sums of kLanes (the
//   CUDA kernel: one block of kLanes threads per matrix); P = M Q's sums over
//   a row of M are lane sums of kDotLanes (CUDA: one warp per element of P;
//   the host: kDotLanes accumulators that vectorise);
// * Q = M^T P and M = P Q^T sum over their inner index (M's row; the rank) in
//   ascending order, from zero (CUDA: one thread per output element; the
//   host: row by row, streaming M once).
//
// The initial Q (ops/low_rank.h) is an integer function: for element e of
// tensor t, initialised at step s with seed `seed`,
//   key = mix(mix(mix(seed) ^ s) ^ t),
//   u_j = mix(key ^ (12 e + j)) >> 40        (24-bit uniforms, j = 0..11),
//   q = (sum_j u_j - 6 * 2^24) * 2^-24       (exact in double, then rounded to A),
// an Irwin-Hall approximation of a standard normal (mean 0, variance 1 up to
// the 2^-24 grid), where mix is splitmix64's finaliser applied to x +
// 0x9E3779B97F4A7C15 (all arithmetic modulo 2^64). Every rank and device
// computes the same bits.
#pragma once

#include <cmath>
#include <cstddef>
#include <cstdint>

#include "kernels/half.h"
#include "kernels/hd.h"

namespace bagua {
namespace low_rank {

constexpr int kLanes = 256;    // the orthogonalisation's lane sums
constexpr int kDotLanes = 32;  // P = M Q's lane sums (a CUDA warp)

// The one step of every sum: s + x * y (never an FMA: see above).
template <typename A>
BAGUA_HD A madd(A s, A x, A y) {
  return s + x * y;
}

// The pairwise tree over L lane sums (see above); returns lane 0, overwriting the lanes.
template <int L, typename A>
BAGUA_HD A lane_tree(A* lanes) {
  for (int s = L / 2; s >= 1; s /= 2)
    for (int l = 0; l < s; ++l) lanes[l] = lanes[l] + lanes[l + s];
  return lanes[0];
}

// The compute type of data of type T, and the conversions.
template <typename T>
struct Acc {
  using type = float;
  static BAGUA_HD float load(T x) { return static_cast<float>(x); }
  static BAGUA_HD T store(float x) { return static_cast<T>(x); }
};
template <>
struct Acc<double> {
  using type = double;
  static BAGUA_HD double load(double x) { return x; }
  static BAGUA_HD double store(double x) { return x; }
};
template <>
struct Acc<Half> {
  using type = float;
  static BAGUA_HD float load(Half x) { return to_float(x); }
  static BAGUA_HD Half store(float x) { return to_half(x); }
};
template <>
struct Acc<BFloat16> {
  using type = float;
  static BAGUA_HD float load(BFloat16 x) { return to_float(x); }
  static BAGUA_HD BFloat16 store(float x) { return to_bfloat16(x); }
};

template <typename T>
struct LowRankMath {
  using A = typename Acc<T>::type;

  // Error feedback, before compression: the gradient plus last step's error,
  // rounded to T (what is compressed), and the error memory holding it.
  static BAGUA_HD void fold_error(T* data, A* error, size_t i) {
    data[i] = Acc<T>::store(Acc<T>::load(data[i]) + error[i]);
    error[i] = Acc<T>::load(data[i]);
  }
  // After decompression: the error is what compression lost.
  static BAGUA_HD void finish_error(const T* data, A* error, size_t i) { error[i] = error[i] - Acc<T>::load(data[i]); }

  // P = M Q, element (a, k): lane l's partial sum (the tree of kDotLanes lanes gives the element).
  static BAGUA_HD A mq_lane(const T* M, const A* Q, size_t m, size_t r, size_t a, size_t k, size_t l) {
    A s = A(0);
    for (size_t j = l; j < m; j += kDotLanes) s = madd(s, Acc<T>::load(M[a * m + j]), Q[j * r + k]);
    return s;
  }
  // Q = M^T P, element (j, k).
  static BAGUA_HD A mtp(const T* M, const A* P, size_t n, size_t m, size_t r, size_t j, size_t k) {
    A s = A(0);
    for (size_t a = 0; a < n; ++a) s = madd(s, Acc<T>::load(M[a * m + j]), P[a * r + k]);
    return s;
  }
  // M = P Q^T, element (a, j), rounded to T.
  static BAGUA_HD T pqt(const A* P, const A* Q, size_t r, size_t a, size_t j) {
    A s = A(0);
    for (size_t k = 0; k < r; ++k) s = madd(s, P[a * r + k], Q[j * r + k]);
    return Acc<T>::store(s);
  }
};

BAGUA_HD float square_root(float x) { return sqrtf(x); }
BAGUA_HD double square_root(double x) { return sqrt(x); }

// Gram-Schmidt's element steps (the same modified Gram-Schmidt as torch's
// PowerSGD hook: normalise column i, then remove it from every later column).
template <typename A>
struct OrthMath {
  // The divisor of column i: its norm plus epsilon.
  static BAGUA_HD A divisor(A sum_of_squares, A epsilon) { return square_root(sum_of_squares) + epsilon; }
  // A column whose divisor is 0 (all zeros, epsilon 0) stays zero, where
  // torch's hook would divide by zero.
  static BAGUA_HD A normalize(A x, A divisor) { return divisor == A(0) ? A(0) : x / divisor; }
  static BAGUA_HD A project(A x, A dot, A q) { return x - dot * q; }
};

// splitmix64's finaliser of x + the golden gamma.
BAGUA_HD uint64_t mix(uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

BAGUA_HD uint64_t init_key(uint64_t seed, uint64_t step, uint64_t tensor) {
  return mix(mix(mix(seed) ^ step) ^ tensor);
}

// Element e of an initial Q (see above), in double.
BAGUA_HD double initial_q(uint64_t key, uint64_t e) {
  uint64_t sum = 0;
  for (uint64_t j = 0; j < 12; ++j) sum += mix(key ^ (12 * e + j)) >> 40;
  return (static_cast<double>(sum) - 6.0 * 16777216.0) * (1.0 / 16777216.0);
}

}  // namespace low_rank
}  // namespace bagua
