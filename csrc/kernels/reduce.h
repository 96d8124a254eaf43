// Element-wise reduction math, written once for CPU loops and CUDA kernels.
//
// Every reduction goes through `Reduce<Op>::apply(a, b)` on the element's
// compute type: float16 and bfloat16 are widened to float32, combined, and
// rounded back to nearest even per element. Integer SUM and PROD wrap like
// the machine type (uint8 wraps modulo 256). AVG is SUM followed by
// `average_element`, which divides by the number of ranks; for integers this
// is C++ division, i.e. it truncates toward zero (-7 / 2 == -3).
#pragma once

#include <cstddef>
#include <cstdint>

#include "common/dtype.h"
#include "kernels/half.h"
#include "kernels/hd.h"

namespace bagua {

// The type arithmetic is done in, and conversions to and from it.
template <typename T>
struct ComputeType {
  using type = T;
  BAGUA_HD static T load(T v) { return v; }
  BAGUA_HD static T store(T v) { return v; }
};
template <>
struct ComputeType<Half> {
  using type = float;
  BAGUA_HD static float load(Half v) { return to_float(v); }
  BAGUA_HD static Half store(float v) { return to_half(v); }
};
template <>
struct ComputeType<BFloat16> {
  using type = float;
  BAGUA_HD static float load(BFloat16 v) { return to_float(v); }
  BAGUA_HD static BFloat16 store(float v) { return to_bfloat16(v); }
};

struct SumOp {
  template <typename C>
  BAGUA_HD static C apply(C a, C b) {
    return static_cast<C>(a + b);
  }
};
struct ProdOp {
  template <typename C>
  BAGUA_HD static C apply(C a, C b) {
    return static_cast<C>(a * b);
  }
};
struct MinOp {
  template <typename C>
  BAGUA_HD static C apply(C a, C b) {
    return b < a ? b : a;
  }
};
struct MaxOp {
  template <typename C>
  BAGUA_HD static C apply(C a, C b) {
    return a < b ? b : a;
  }
};

// Bitwise operators: instantiated for integer types only (cpu_reduce.cc refuses others).
struct BorOp {
  template <typename C>
  BAGUA_HD static C apply(C a, C b) {
    return static_cast<C>(a | b);
  }
};
struct BandOp {
  template <typename C>
  BAGUA_HD static C apply(C a, C b) {
    return static_cast<C>(a & b);
  }
};
struct BxorOp {
  template <typename C>
  BAGUA_HD static C apply(C a, C b) {
    return static_cast<C>(a ^ b);
  }
};

// out = a (op) b for one element of storage type T.
template <typename Op, typename T>
BAGUA_HD T reduce_element(T a, T b) {
  using CT = ComputeType<T>;
  return CT::store(Op::apply(CT::load(a), CT::load(b)));
}

// x / divisor for one element (the second half of AVG).
template <typename T>
BAGUA_HD T average_element(T x, int divisor) {
  using CT = ComputeType<T>;
  using C = typename CT::type;
  return CT::store(static_cast<C>(CT::load(x) / static_cast<C>(divisor)));
}

// ---- CPU entry points (csrc/kernels/cpu_reduce.cc) -------------------------

// out[i] = a[i] (op) b[i] for n elements; out may alias a or b. AVG reduces
// like SUM (divide afterwards with cpu_average).
using ReduceFn = void (*)(void* out, const void* a, const void* b, size_t n);

// The loop for one (dtype, op) pair, chosen once per operation so that the
// hot loop has no per-element dispatch. Throws bagua::InvalidArgument on an
// unknown dtype or op.
ReduceFn cpu_reduce_fn(DType dtype, ReduceOp op);

void cpu_reduce(void* out, const void* a, const void* b, size_t n, DType dtype, ReduceOp op);

// buf[i] /= divisor (AVG's final step; truncating for integers).
void cpu_average(void* buf, size_t n, DType dtype, int divisor);

}  // namespace bagua
