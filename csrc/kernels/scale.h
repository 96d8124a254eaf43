// Element-wise scaling and division, written once for CPU loops (g++) and CUDA
// kernels (nvcc). Used e.g. to turn a SUM into an AVG.
//
// Floating types compute in their own precision (float16/bfloat16 through
// float32, rounded to nearest even on store). Integer division truncates
// toward zero, as NCCL's integer AVG does; integer scaling computes in double
// and truncates toward zero.
#pragma once

#include <cstddef>
#include <cstdint>

#include "common/dtype.h"
#include "kernels/half.h"
#include "kernels/hd.h"

namespace bagua {

// ScaleMath<T>: the factor/divisor types of storage type T, converted once per
// call on the host, and the per-element functions.
template <typename T>
struct ScaleMath;

template <typename F>
struct FloatScaleMath {
  using Factor = F;
  using Divisor = F;
  static Factor factor(double f) { return static_cast<F>(f); }
  static Divisor divisor(double d) { return static_cast<F>(d); }
  static BAGUA_HD F scale(F x, Factor f) { return x * f; }
  static BAGUA_HD F divide(F x, Divisor d) { return x / d; }
};

template <>
struct ScaleMath<float> : FloatScaleMath<float> {};
template <>
struct ScaleMath<double> : FloatScaleMath<double> {};

template <typename H>
struct HalfScaleMath {
  using Factor = float;
  using Divisor = float;
  static Factor factor(double f) { return static_cast<float>(f); }
  static Divisor divisor(double d) { return static_cast<float>(d); }
  static BAGUA_HD H scale(H x, Factor f) { return store_f32<H>(to_float(x) * f); }
  static BAGUA_HD H divide(H x, Divisor d) { return store_f32<H>(to_float(x) / d); }
};

template <>
struct ScaleMath<Half> : HalfScaleMath<Half> {};
template <>
struct ScaleMath<BFloat16> : HalfScaleMath<BFloat16> {};

template <typename I>
struct IntScaleMath {
  using Factor = double;
  using Divisor = int64_t;
  static Factor factor(double f) { return f; }
  // The caller checks that d is a non-zero integer (integer_divisor_ok).
  static Divisor divisor(double d) { return static_cast<int64_t>(d); }
  static BAGUA_HD I scale(I x, Factor f) { return static_cast<I>(static_cast<double>(x) * f); }
  static BAGUA_HD I divide(I x, Divisor d) { return static_cast<I>(static_cast<int64_t>(x) / d); }
};

template <>
struct ScaleMath<int32_t> : IntScaleMath<int32_t> {};
template <>
struct ScaleMath<int64_t> : IntScaleMath<int64_t> {};
template <>
struct ScaleMath<uint8_t> : IntScaleMath<uint8_t> {};

inline bool is_integer_dtype(DType t) { return t == DType::kInt32 || t == DType::kInt64 || t == DType::kUInt8; }

// Integer division needs a non-zero whole divisor that fits in int64.
inline bool integer_divisor_ok(double d) {
  return d != 0.0 && d == static_cast<double>(static_cast<int64_t>(d)) && d > -9.2e18 && d < 9.2e18;
}

// Calls f(T{}) with T the storage type of `dtype`; returns false for an unknown dtype.
template <typename F>
bool visit_dtype(DType dtype, F&& f) {
  switch (dtype) {
    case DType::kFloat32: f(float{}); return true;
    case DType::kFloat64: f(double{}); return true;
    case DType::kFloat16: f(Half{}); return true;
    case DType::kBFloat16: f(BFloat16{}); return true;
    case DType::kInt32: f(int32_t{}); return true;
    case DType::kInt64: f(int64_t{}); return true;
    case DType::kUInt8: f(uint8_t{}); return true;
  }
  return false;
}

// Host loops over the same element functions (the CPU reference for the kernels).
// Both throw bagua::InvalidArgument for a bad dtype or integer divisor.
void scale_host(void* data, size_t count, DType dtype, double factor);
void divide_host(void* data, size_t count, DType dtype, double divisor);

}  // namespace bagua
