// float16 / bfloat16 storage types and their conversions, shared by CPU and CUDA.
// Conversions go through float32 and round to nearest even, as the hardware does.
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

BAGUA_HD float to_float(BFloat16 h) { return bits_float(static_cast<uint32_t>(h.bits) << 16); }

BAGUA_HD BFloat16 to_bfloat16(float f) {
  uint32_t u = float_bits(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return BFloat16{static_cast<uint16_t>((u >> 16) | 0x40u)};  // quiet NaN
  u += 0x7fffu + ((u >> 16) & 1u);  // round to nearest even
  return BFloat16{static_cast<uint16_t>(u >> 16)};
}

BAGUA_HD float to_float(Half h) {
  uint32_t sign = static_cast<uint32_t>(h.bits & 0x8000u) << 16;
  uint32_t exp = (h.bits >> 10) & 0x1fu;
  uint32_t man = h.bits & 0x3ffu;
  if (exp == 0x1fu) return bits_float(sign | 0x7f800000u | (man << 13));  // Inf / NaN
  if (exp == 0) {
    if (man == 0) return bits_float(sign);
    // subnormal: value = man * 2^-24
    float v = static_cast<float>(man) * 5.9604644775390625e-08f;
    return sign ? -v : v;
  }
  return bits_float(sign | ((exp + 112u) << 23) | (man << 13));
}

BAGUA_HD Half to_half(float f) {
  uint32_t u = float_bits(f);
  uint16_t sign = static_cast<uint16_t>((u >> 16) & 0x8000u);
  uint32_t a = u & 0x7fffffffu;
  if (a > 0x7f800000u) return Half{static_cast<uint16_t>(sign | 0x7e00u)};  // NaN
  if (a >= 0x477ff000u) return Half{static_cast<uint16_t>(sign | 0x7c00u)};  // overflow -> Inf
  if (a < 0x38800000u) {
    // subnormal or zero: round(|f| * 2^24) to nearest even
    float v = bits_float(a) * 16777216.0f;
    uint32_t r = static_cast<uint32_t>(v);
    float frac = v - static_cast<float>(r);
    if (frac > 0.5f || (frac == 0.5f && (r & 1u))) ++r;
    return Half{static_cast<uint16_t>(sign | r)};
  }
  uint32_t m = a + 0xc8000fffu + ((a >> 13) & 1u);  // rebias exponent, round to nearest even
  return Half{static_cast<uint16_t>(sign | (m >> 13))};
}

template <typename T>
BAGUA_HD T from_float(float f);
template <>
BAGUA_HD Half from_float<Half>(float f) { return to_half(f); }
template <>
BAGUA_HD BFloat16 from_float<BFloat16>(float f) { return to_bfloat16(f); }

}  // namespace bagua
