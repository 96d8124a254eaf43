// MinMaxUInt8 compression: the ONE definition of its byte layout and element math.
// CPU loops (compress_cpu.cc) and CUDA kernels (compress_cuda.cu) both use the functions below,
// so both devices produce the same bytes and the same decoded values.
//
// ---------------------------------------------------------------------------------------------
// Input
//   n elements of float32, float64, float16 or bfloat16, split into n_chunks equal chunks of
//   chunk_len = n / n_chunks elements (n must be divisible by n_chunks, n_chunks >= 1).
//   Elements are converted to float32 first (exact for float16/bfloat16; float64 rounds to
//   nearest, and values beyond float32's range become +-Inf).
//
// Byte layout of the compressed buffer
//   n_chunks chunk records of record_bytes(chunk_len) bytes each, back to back; record k starts at
//   byte k * record_bytes(chunk_len). Inside a record (offsets in bytes):
//     [0, 4)                      float32 min of the chunk (host byte order, little-endian on every
//                                 supported platform)
//     [4, 8)                      float32 max of the chunk
//     [8, 32)                     zero
//     [32, 32 + chunk_len)        uint8 codes, one per element, in element order
//     [32 + chunk_len, record)    zero padding
//   record_bytes(chunk_len) = align_up(32 + chunk_len, 64).
//   Records are equal-size multiples of 64 bytes, so alltoall/allgather exchange them as equal byte
//   blocks, and a record starts 64-byte aligned whenever the buffer does. Compression writes every
//   byte of each record it writes, so equal inputs give bitwise-equal records.
//
// Element math (float32, the formula of the original Bagua, so codes match its reference compressor)
//   scale = 255 / (max - min + 1e-7)
//   upper = rint(max * scale)          lower = upper - 255
//   code  = clamp(min(rint(x * scale), upper) - lower, 0, 255)        rint: round half to even
//   x_hat = (code + lower) / scale     (then rounded to the output dtype)
//   The clamp to [0, 255] is ours: the original converted without a lower clamp (undefined for
//   negative or NaN values). In exact arithmetic codes already lie in [0, 255]; the clamp only catches
//   float32 rounding and huge magnitudes. A NaN code value becomes 0.
//
// Special chunks (defined outcomes, tested)
//   * Non-finite chunk: if the chunk holds any NaN or +-Inf, or if max - min overflows float32 (e.g.
//     -3e38 and 3e38 in one chunk), its header stores min = max = NaN, all its codes are 0, and
//     EVERY element of the chunk decodes to NaN (a reduce over such a record gives NaN too).
//     Propagating makes training notice, as it would without compression; clamping would silently
//     corrupt the values. (max * scale cannot overflow otherwise: distinct float32 values are at
//     least one ulp apart, so max / (max - min) <= 2^24.)
//   * Constant chunk (min == max, finite): codes follow the formula, and every element decodes to
//     exactly min (the formula alone would be off by float32 rounding there).
//   * Empty chunk (n == 0): header min = max = 0, no codes.
//
// Accuracy: |x_hat - x| <= (max - min + 1e-7) / 510 in exact arithmetic (half a quantisation step).
//   The formula works in float32 on absolute values, so x * scale loses precision once
//   max(|min|, |max|) / (max - min) approaches 2^24 / 255 (about 65000); codes stay defined.
//
// Quantisation residual (ByteGrad's error feedback, ops/bytegrad.h): residual decodes a chunk's records
//   and writes e = x - x_hat, x_hat rounded to the data's dtype first (the value decompress stores);
//   the difference is taken in float32 (float64 for float64) and rounded to the dtype once. A
//   non-finite chunk's residual is NaN throughout.
//
// Decompress-and-reduce: reduce_chunks decodes n_records records (one per peer) of the same chunk
//   length and sums them in float32, record 0 first, then divides by n_records when averaging; the
//   sum is rounded to the output dtype once at the end (the original rounded each decoded peer value
//   to the source dtype first).
// ---------------------------------------------------------------------------------------------
#pragma once

#include <cstddef>
#include <cstdint>

#include "kernels/half.h"
#include "kernels/hd.h"

namespace bagua {
namespace minmax_uint8 {

constexpr size_t kHeaderBytes = 32;
constexpr size_t kRecordAlign = 64;
constexpr float kEps = 1e-7f;

struct Header {
  float min;
  float max;
  uint32_t reserved[6];  // zero in every written record (CUDA uses it as scratch while compressing)
};
static_assert(sizeof(Header) == kHeaderBytes, "header layout");

// Bytes of one chunk record (header + codes + padding).
BAGUA_HD size_t record_bytes(size_t chunk_len) {
  return (kHeaderBytes + chunk_len + kRecordAlign - 1) / kRecordAlign * kRecordAlign;
}

// Bytes of the whole compressed buffer; n must be divisible by n_chunks.
BAGUA_HD size_t compressed_size(size_t n, size_t n_chunks) { return n_chunks * record_bytes(n / n_chunks); }

// Conversions to and from float32: load_f32 / store_f32 (kernels/half.h).

// ---- branch-free helpers (selects compile to min/max/blend instructions) ---------------------
// Round half to even (rint in the default rounding mode). The CPU version avoids a libm call so
// the loops vectorise: adding and subtracting 2^23 rounds any |v| < 2^23 to an integer; larger
// values are integers already; NaN stays NaN.
BAGUA_HD float round_even(float v) {
#if defined(__CUDA_ARCH__)
  return rintf(v);
#else
  const uint32_t u = float_bits(v);
  const float big = bits_float((u & 0x80000000u) | 0x4b000000u);  // copysign(2^23, v)
  const float r = (v + big) - big;
  return static_cast<int32_t>(u & 0x7fffffffu) < 0x4b000000 ? r : v;  // |v| < 2^23 (false for NaN)
#endif
}

// ---- chunk statistics --------------------------------------------------------------------------
// Min and max are tracked as order keys: int32 values that compare like the floats they encode
// (-0 < +0), so the reduction is exact, independent of the order of elements, vectorises as integer
// min/max on the CPU and maps to atomicMin/atomicMax on the GPU. `bad` becomes nonzero once a NaN or
// +-Inf is seen (whatever those did to the keys no longer matters then).
struct Stats {
  int32_t min_key;
  int32_t max_key;
  uint32_t bad;
};

BAGUA_HD int32_t order_key(float x) {
  const int32_t i = static_cast<int32_t>(float_bits(x));
  return i ^ ((i >> 31) & 0x7fffffff);
}
// order_key is its own inverse on the bits.
BAGUA_HD float key_value(int32_t k) { return bits_float(static_cast<uint32_t>(k ^ ((k >> 31) & 0x7fffffff))); }

BAGUA_HD float nan_f32() { return bits_float(0x7fc00000u); }

BAGUA_HD Stats stats_init() { return Stats{0x7fffffff, -0x7fffffff - 1, 0u}; }

BAGUA_HD void stats_add(Stats& s, float x) {
  const int32_t k = order_key(x);
  s.min_key = k < s.min_key ? k : s.min_key;
  s.max_key = k > s.max_key ? k : s.max_key;
  s.bad |= static_cast<uint32_t>((float_bits(x) & 0x7f800000u) == 0x7f800000u);
}

BAGUA_HD Stats stats_merge(Stats a, Stats b) {
  return Stats{b.min_key < a.min_key ? b.min_key : a.min_key, b.max_key > a.max_key ? b.max_key : a.max_key,
               a.bad | b.bad};
}

// The header values for a chunk with statistics s (see "Special chunks" above).
BAGUA_HD Header make_header(Stats s) {
  Header h = {};
  if (s.bad != 0u) {  // NaN or +-Inf seen
    h.min = h.max = nan_f32();
  } else if (s.min_key > s.max_key) {  // no element: empty chunk
    h.min = h.max = 0.0f;
  } else {
    h.min = key_value(s.min_key);
    h.max = key_value(s.max_key);
    if (!(h.max - h.min <= 3.402823466e38f)) h.min = h.max = nan_f32();  // the spread overflows
  }
  return h;
}

// ---- encode ------------------------------------------------------------------------------------
struct Encoder {
  float scale;
  float upper;
  float lower;
};

// A NaN header gives a NaN encoder, whose codes are all 0.
BAGUA_HD Encoder make_encoder(float min, float max) {
  Encoder e;
  e.scale = 255.0f / (max - min + kEps);
  e.upper = round_even(max * e.scale);
  e.lower = e.upper - 255.0f;
  return e;
}

BAGUA_HD uint8_t encode(float x, Encoder e) {
  float r = round_even(x * e.scale);
  r = r < e.upper ? r : e.upper;
  float q = r - e.lower;
  q = q > 0.0f ? q : 0.0f;  // also maps NaN to 0
  q = q < 255.0f ? q : 255.0f;
  return static_cast<uint8_t>(static_cast<int32_t>(q));
}

// ---- decode ------------------------------------------------------------------------------------
struct Decoder {
  float lower;
  float scale;
  float constant;  // the chunk's value when is_constant
  bool is_constant;
};

// A NaN header gives NaN scale and lower, so every decoded value is NaN.
BAGUA_HD Decoder make_decoder(float min, float max) {
  Encoder e = make_encoder(min, max);
  return Decoder{e.lower, e.scale, min, min == max};
}

BAGUA_HD float decode(uint8_t code, Decoder d) {
  const float v = (static_cast<float>(code) + d.lower) / d.scale;
  return d.is_constant ? d.constant : v;
}

// ---- quantisation residual --------------------------------------------------------------------
// e = x - x_hat for x_hat = decode(...), as the header describes.
BAGUA_HD float residual(float x, float x_hat) { return x - x_hat; }
BAGUA_HD double residual(double x, float x_hat) { return x - static_cast<double>(x_hat); }
BAGUA_HD Half residual(Half x, float x_hat) { return to_half(to_float(x) - to_float(to_half(x_hat))); }
BAGUA_HD BFloat16 residual(BFloat16 x, float x_hat) { return to_bfloat16(to_float(x) - to_float(to_bfloat16(x_hat))); }

// ---- record access -----------------------------------------------------------------------------
BAGUA_HD uint8_t* record_ptr(void* base, size_t chunk_len, size_t k) {
  return static_cast<uint8_t*>(base) + k * record_bytes(chunk_len);
}
BAGUA_HD const uint8_t* record_ptr(const void* base, size_t chunk_len, size_t k) {
  return static_cast<const uint8_t*>(base) + k * record_bytes(chunk_len);
}

}  // namespace minmax_uint8
}  // namespace bagua
