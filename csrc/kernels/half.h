// float16 / bfloat16 storage types and their conversions, shared by CPU and CUDA.
//
// Conversions go through float32 and round to nearest even. Results are bit-identical to numpy
// (float16) and ml_dtypes (bfloat16), NaN payloads included (tests/core/test_half_conversions.py checks
// every 16-bit pattern and the float32 rounding boundaries):
//   float16 -> float32: exact; NaN payloads are kept (not quieted), as numpy does.
//   float32 -> float16: overflow gives +-Inf; NaN keeps the top 10 payload bits (at least one set).
//   float32 -> bfloat16: NaN becomes the quiet NaN +-0x7fc0, as ml_dtypes does.
//
// The functions are branch-free: every case is computed and the result picked with select_bits
// (and/andnot/or on integers), so loops over float16 arrays vectorise (SSE2 and up). The only float
// operations (one per direction, for subnormal results) are exact or round to nearest even in the
// default rounding mode, and give the same bits with flush-to-zero / denormals-are-zero enabled.
// nvcc compiles the same code, so CPU and GPU produce the same bits.
#pragma once

#include <cstdint>
#include <cstring>

#include "kernels/hd.h"

namespace bagua {

struct Half {
  uint16_t bits;
};
struct BFloat16 {
  uint16_t bits;
};

BAGUA_HD uint32_t float_bits(float f) {
#if defined(__CUDA_ARCH__)
  return __float_as_uint(f);
#else
  uint32_t u;
  std::memcpy(&u, &f, sizeof(u));
  return u;
#endif
}

BAGUA_HD float bits_float(uint32_t u) {
#if defined(__CUDA_ARCH__)
  return __uint_as_float(u);
#else
  float f;
  std::memcpy(&f, &u, sizeof(f));
  return f;
#endif
}

// c ? x : y as bit arithmetic. Unlike a ?: select, this keeps every case's arithmetic
// unconditional: GCC would otherwise move a float addition into the branch that uses it and then,
// under the default -ftrapping-math, refuse to if-convert (and so to vectorise) the loop.
BAGUA_HD uint32_t select_bits(bool c, uint32_t x, uint32_t y) {
  const uint32_t mask = 0u - static_cast<uint32_t>(c);
  return (x & mask) | (y & ~mask);
}

// ---- bfloat16 ----------------------------------------------------------------------------------

BAGUA_HD float to_float(BFloat16 h) { return bits_float(static_cast<uint32_t>(h.bits) << 16); }

BAGUA_HD BFloat16 to_bfloat16(float f) {
  const uint32_t u = float_bits(f);
  // Candidates hold the result in their top 16 bits (see to_half for why).
  const uint32_t rounded = u + 0x7fffu + ((u >> 16) & 1u);  // round to nearest even; Inf stays Inf
  const uint32_t nan = (u & 0x80000000u) | 0x7fc00000u;
  const bool is_nan = static_cast<int32_t>(u & 0x7fffffffu) > 0x7f800000;
  return BFloat16{static_cast<uint16_t>(select_bits(is_nan, nan, rounded) >> 16)};
}

// ---- float16 -----------------------------------------------------------------------------------

BAGUA_HD float to_float(Half h) {
  const uint32_t sign = static_cast<uint32_t>(h.bits & 0x8000u) << 16;
  const int32_t em = h.bits & 0x7fff;  // exponent and mantissa
  const uint32_t shifted = static_cast<uint32_t>(em) << 13;
  // Normal: rebias the exponent from 15 to 127. Inf / NaN: rebias twice, which sets all exponent
  // bits (0x1f + 2 * 112 = 0xff) and keeps the payload.
  const uint32_t normal = shifted + 0x38000000u + ((0u - static_cast<uint32_t>(em >= 0x7c00)) & 0x38000000u);
  // Zero / subnormal: man * 2^-24 = (2^-14 + man * 2^-24) - 2^-14, both exact in float32.
  const uint32_t subnormal = float_bits(bits_float(shifted + 0x38800000u) - bits_float(0x38800000u));
  return bits_float(sign | select_bits(em < 0x0400, subnormal, normal));
}

BAGUA_HD Half to_half(float f) {
  const uint32_t u = float_bits(f);
  const uint32_t a = u & 0x7fffffffu;
  const int32_t ai = static_cast<int32_t>(a);  // non-negative: signed compares suffice (SSE2 has no others)
  // Each candidate holds the 15-bit result in bits 13..27 and is shifted down once at the end, so
  // the selects need 32-bit lanes and the vectoriser does not narrow every step to 16 bits (which
  // costs a pack per operation).
  // Normal result: rebias the exponent (127 -> 15) and round the dropped 13 bits to nearest even.
  // A carry out of the mantissa bumps the exponent, up to Inf for [65520, 65536).
  const uint32_t normal = a + 0xc8000fffu + ((a >> 13) & 1u);
  // Subnormal or zero result (|f| < 2^-14): adding 0.5 leaves |f| in the low mantissa bits of the
  // sum in units of 2^-24 (the float16 subnormal step), rounded to nearest even by the addition.
  const uint32_t subnormal = (float_bits(bits_float(a) + 0.5f) - 0x3f000000u) << 13;
  // |f| >= 2^16 and Inf: Inf. NaN: Inf's bits plus the top 10 payload bits, numpy's way (a payload
  // that truncates to 0 becomes 1).
  const uint32_t payload = a & 0x007fe000u;
  const uint32_t nan_payload = payload | (static_cast<uint32_t>(payload == 0u) << 13);
  const uint32_t inf_nan = 0x0f800000u | ((0u - static_cast<uint32_t>(ai > 0x7f800000)) & nan_payload);
  uint32_t r = select_bits(ai < 0x38800000, subnormal, normal);
  r = select_bits(ai >= 0x47800000, inf_nan, r);
  return Half{static_cast<uint16_t>(((u >> 16) & 0x8000u) | (r >> 13))};
}

// ---- any floating element to and from float32 (float64 rounds to float32) ---------------------

BAGUA_HD float load_f32(float x) { return x; }
BAGUA_HD float load_f32(double x) { return static_cast<float>(x); }
BAGUA_HD float load_f32(Half x) { return to_float(x); }
BAGUA_HD float load_f32(BFloat16 x) { return to_float(x); }

template <typename T>
BAGUA_HD T store_f32(float x) {
  return static_cast<T>(x);
}
template <>
BAGUA_HD Half store_f32<Half>(float x) {
  return to_half(x);
}
template <>
BAGUA_HD BFloat16 store_f32<BFloat16>(float x) {
  return to_bfloat16(x);
}

}  // namespace bagua
