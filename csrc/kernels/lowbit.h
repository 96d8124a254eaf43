// Low-bit block codecs: the ONE definition of the wire formats below 8 bits per element
// (minmax_uint4, minmax_uint2, fp4_e2m1, topk_uint4, topk_uint2): byte layout and element math.
// The host loops (lowbit_cpu.cc) and the CUDA kernels (lowbit_cuda.cu) call the block functions
// below, so both devices write the same bytes and decode the same values.
//
// ---------------------------------------------------------------------------------------------
// Input: n elements of float32, float64, float16 or bfloat16 in n_chunks equal chunks (as
//   kernels/minmax_uint8.h), converted to float32 first. Each chunk is cut into blocks of
//   block_len(spec) elements (the last one may be shorter); every block is coded on its own.
//
// Byte layout: n_chunks chunk records of record_bytes(spec, chunk_len) bytes, back to back. A chunk
//   record holds ceil(chunk_len / block_len) block records of block_bytes(spec) bytes each, in
//   element order, then zero padding to a multiple of 64 bytes (so records exchange as equal byte
//   blocks and start 64-byte aligned). A short last block has a full-size block record. Compression
//   writes every byte of every record it writes (unused bits are zero): equal inputs, equal bytes.
//   Floats are stored in host byte order (little-endian on every supported platform).
//
//   minmax_uint{4,2} (b = 4 or 2 bits, L = 2^b - 1), blocks of 128 elements:
//     [0, 4) float32 min   [4, 8) float32 max   [8, 8 + 16 b) codes, 8 / b per byte
//     Codes pack from the low bits: element i of the block is bits [b (i % (8/b)), ...) of byte
//     8 + i / (8/b). 4.5 (b = 4) or 2.5 (b = 2) bits per element.
//     step = (max - min) / L;  q = clamp(rint((x - min) / step), 0, L)  (q = 0 when step == 0)
//     x_hat = min + q * step.  |x_hat - x| <= step / 2 up to float32 rounding; a constant block
//     decodes exactly (q = 0 gives min).
//
//   fp4_e2m1 (OCP FP4: sign, 2 exponent bits, 1 mantissa bit), blocks of 32 elements:
//     [0, 4) float32 scale = absmax / 6   [4, 20) codes, two per byte, low nibble first
//     code = sign << 3 | i, i the index in the magnitude grid {0, 0.5, 1, 1.5, 2, 3, 4, 6} nearest to
//     |x| / scale, ties to the even index (the grid's own round-half-to-even); x_hat = +-grid[i] *
//     scale. The block's largest magnitude maps to 6; |x_hat - x| <= scale (half the widest grid
//     gap). An all-zero block has scale 0 and decodes to zeros (signs kept). 5 bits per element.
//
//   topk_uint{4,2} (b = 4 or 2 bits), blocks of 256 elements, k = spec.k kept per block
//     (1 <= k <= 256; a short block keeps min(k, len)):
//     [0, 4) float32 min   [4, 8) float32 max of the kept values   [8, 8 + k) uint8 indices of the
//     kept elements in the block, ascending   then ceil(k b / 8) bytes of their codes (minmax_uint{b}
//     math and packing over the kept values, in index order)   then zeros to a multiple of 4 bytes.
//     Kept: the k largest |x|; among equal |x| the lower index. Decoding writes zero elsewhere.
//     (8 + k + ceil(k b / 8), rounded up to 4) * 8 / 256 bits per element.
//
// Non-finite input: a block holding NaN or +-Inf, or whose max - min overflows float32, stores NaN
//   in its float header(s) and zero codes (and, top-k, indices 0, 1, ...), and decodes to NaN in
//   every element, so a reduction over it is NaN too. (LocalSteps refuses such a pseudo-gradient
//   with an error naming the rank: ops/local_steps.h.)
//
// Residual (error feedback): e = x - x_hat, x_hat rounded to the data's dtype first, the difference
//   in float32 (float64 for float64 data) rounded to the dtype once (as minmax_uint8's residual).
// Reduction: n_records records of the same chunk decode and sum in float32, starting from +0, record
//   0 first; the sum is divided by n_records when averaging and rounded to the output dtype once.
// ---------------------------------------------------------------------------------------------
#pragma once

#include <cstddef>
#include <cstdint>

#include "kernels/half.h"
#include "kernels/hd.h"
#include "kernels/minmax_uint8.h"

namespace bagua {
namespace lowbit {

enum class Format : int32_t { kMinmax4 = 0, kMinmax2 = 1, kFp4E2M1 = 2, kTopk4 = 3, kTopk2 = 4 };

// A format and, for the top-k formats, the elements kept per block.
struct Spec {
  Format format = Format::kMinmax4;
  uint32_t k = 0;
};

constexpr size_t kRecordAlign = 64;
constexpr size_t kMaxBlock = 256;  // the longest block of any format
constexpr size_t kMinmaxBlock = 128;
constexpr size_t kFp4Block = 32;
constexpr size_t kTopkBlock = 256;

BAGUA_HD bool is_topk(Spec s) { return s.format == Format::kTopk4 || s.format == Format::kTopk2; }

BAGUA_HD uint32_t bits(Spec s) { return (s.format == Format::kMinmax2 || s.format == Format::kTopk2) ? 2u : 4u; }

BAGUA_HD size_t block_len(Spec s) {
  return s.format == Format::kFp4E2M1 ? kFp4Block : is_topk(s) ? kTopkBlock : kMinmaxBlock;
}

BAGUA_HD size_t code_bytes(size_t count, uint32_t b) { return (count * b + 7) / 8; }

BAGUA_HD size_t block_bytes(Spec s) {
  if (s.format == Format::kFp4E2M1) return 4 + code_bytes(kFp4Block, 4);
  if (is_topk(s)) return (8 + s.k + code_bytes(s.k, bits(s)) + 3) / 4 * 4;
  return 8 + code_bytes(kMinmaxBlock, bits(s));
}

BAGUA_HD size_t n_blocks(Spec s, size_t chunk_len) { return (chunk_len + block_len(s) - 1) / block_len(s); }

BAGUA_HD size_t record_bytes(Spec s, size_t chunk_len) {
  return (n_blocks(s, chunk_len) * block_bytes(s) + kRecordAlign - 1) / kRecordAlign * kRecordAlign;
}

BAGUA_HD size_t compressed_size(Spec s, size_t n, size_t n_chunks) { return n_chunks * record_bytes(s, n / n_chunks); }

// ---- shared pieces -----------------------------------------------------------------------------
using minmax_uint8::nan_f32;
using minmax_uint8::round_even;

BAGUA_HD bool non_finite(float x) { return (float_bits(x) & 0x7f800000u) == 0x7f800000u; }

BAGUA_HD void store_f32_at(uint8_t* p, float v) {
  const uint32_t u = float_bits(v);
  p[0] = static_cast<uint8_t>(u);
  p[1] = static_cast<uint8_t>(u >> 8);
  p[2] = static_cast<uint8_t>(u >> 16);
  p[3] = static_cast<uint8_t>(u >> 24);
}
BAGUA_HD float load_f32_at(const uint8_t* p) {
  return bits_float(static_cast<uint32_t>(p[0]) | static_cast<uint32_t>(p[1]) << 8 | static_cast<uint32_t>(p[2]) << 16 |
                    static_cast<uint32_t>(p[3]) << 24);
}

BAGUA_HD void put_code(uint8_t* codes, size_t i, uint32_t b, uint32_t q) {
  const uint32_t per = 8u / b;
  codes[i / per] = static_cast<uint8_t>(codes[i / per] | (q << (b * (i % per))));
}
BAGUA_HD uint32_t get_code(const uint8_t* codes, size_t i, uint32_t b) {
  const uint32_t per = 8u / b;
  return (codes[i / per] >> (b * (i % per))) & ((1u << b) - 1u);
}

// Min-max coding of `count` values x[idx[j]] (idx null: x[j]) at b bits into header + codes.
struct MinMax {
  float min;
  float max;
};

BAGUA_HD MinMax minmax_stats(const float* x, const uint8_t* idx, size_t count) {
  float mn = 0.0f, mx = 0.0f;
  bool bad = false;
  for (size_t j = 0; j < count; ++j) {
    const float v = x[idx ? idx[j] : j];
    bad |= non_finite(v);
    if (j == 0 || v < mn) mn = v;
    if (j == 0 || v > mx) mx = v;
  }
  if (bad || !(mx - mn <= 3.402823466e38f)) return MinMax{nan_f32(), nan_f32()};
  return MinMax{mn, mx};
}

BAGUA_HD float minmax_step(MinMax h, uint32_t b) { return (h.max - h.min) / static_cast<float>((1u << b) - 1u); }

BAGUA_HD uint32_t minmax_code(float x, MinMax h, float step, uint32_t b) {
  if (!(step > 0.0f)) return 0u;  // constant block, or NaN header
  float q = round_even((x - h.min) / step);
  const float top = static_cast<float>((1u << b) - 1u);
  q = q > 0.0f ? q : 0.0f;
  q = q < top ? q : top;
  return static_cast<uint32_t>(q);
}

BAGUA_HD float minmax_value(uint32_t q, MinMax h, float step) { return h.min + static_cast<float>(q) * step; }

// ---- FP4 E2M1 ------------------------------------------------------------------------------------
BAGUA_HD float fp4_magnitude(uint32_t i) {
  // {0, 0.5, 1, 1.5, 2, 3, 4, 6}
  return i < 4u ? 0.5f * static_cast<float>(i) : (i < 6u ? static_cast<float>(i - 2u) : (i == 6u ? 4.0f : 6.0f));
}

// The grid index nearest to v >= 0, ties to the even index.
BAGUA_HD uint32_t fp4_index(float v) {
  return static_cast<uint32_t>(v > 0.25f) + static_cast<uint32_t>(v >= 0.75f) + static_cast<uint32_t>(v > 1.25f) +
         static_cast<uint32_t>(v >= 1.75f) + static_cast<uint32_t>(v > 2.5f) + static_cast<uint32_t>(v >= 3.5f) +
         static_cast<uint32_t>(v > 5.0f);
}

// ---- top-k selection -----------------------------------------------------------------------------
// Marks in `keep` (len flags) the min(k, len) elements of largest |x|, lower index first among
// equals, by a radix select on the magnitudes' bits (8 bits per pass), then returns how many.
BAGUA_HD size_t topk_select(const float* x, size_t len, uint32_t k, uint8_t* keep) {
  size_t need = k < len ? k : len;
  const size_t kept = need;
  uint32_t prefix = 0u, mask = 0u;
  for (int shift = 24; shift >= 0; shift -= 8) {
    uint32_t hist[256];
    for (int d = 0; d < 256; ++d) hist[d] = 0u;
    for (size_t i = 0; i < len; ++i) {
      const uint32_t key = float_bits(x[i]) & 0x7fffffffu;
      if ((key & mask) == prefix) ++hist[(key >> shift) & 255u];
    }
    int d = 255;
    for (; d > 0; --d) {
      if (hist[d] >= need) break;
      need -= hist[d];
    }
    prefix |= static_cast<uint32_t>(d) << shift;
    mask |= 255u << shift;
  }
  // prefix is the kept magnitudes' smallest key; `need` elements equal to it are kept.
  for (size_t i = 0; i < len; ++i) {
    const uint32_t key = float_bits(x[i]) & 0x7fffffffu;
    bool take = key > prefix;
    if (key == prefix && need > 0) {
      take = true;
      --need;
    }
    keep[i] = take ? 1u : 0u;
  }
  return kept;
}

// ---- one block ---------------------------------------------------------------------------------
// Writes block record `rec` (block_bytes(s) bytes) from x[0, len), len <= block_len(s).
BAGUA_HD void encode_block(Spec s, const float* x, size_t len, uint8_t* rec) {
  const size_t nb = block_bytes(s);
  for (size_t i = 0; i < nb; ++i) rec[i] = 0u;
  const uint32_t b = bits(s);
  if (s.format == Format::kFp4E2M1) {
    float absmax = 0.0f;
    bool bad = false;
    for (size_t i = 0; i < len; ++i) {
      bad |= non_finite(x[i]);
      const float a = x[i] < 0.0f ? -x[i] : x[i];
      absmax = a > absmax ? a : absmax;
    }
    const float scale = bad ? nan_f32() : absmax / 6.0f;
    store_f32_at(rec, scale);
    if (!(scale > 0.0f)) {  // zeros (signs kept) or NaN
      for (size_t i = 0; i < len; ++i)
        if (!bad && (float_bits(x[i]) >> 31)) put_code(rec + 4, i, 4, 8u);
      return;
    }
    for (size_t i = 0; i < len; ++i) {
      const uint32_t sign = float_bits(x[i]) >> 31;
      const float a = x[i] < 0.0f ? -x[i] : x[i];
      put_code(rec + 4, i, 4, sign << 3 | fp4_index(a / scale));
    }
    return;
  }
  if (is_topk(s)) {
    uint8_t keep[kTopkBlock];
    uint8_t idx[kTopkBlock];
    bool bad = false;
    for (size_t i = 0; i < len; ++i) bad |= non_finite(x[i]);
    size_t kept = 0;
    if (bad) {
      kept = s.k < len ? s.k : len;
      for (size_t j = 0; j < kept; ++j) idx[j] = static_cast<uint8_t>(j);
    } else {
      topk_select(x, len, s.k, keep);
      for (size_t i = 0; i < len; ++i)
        if (keep[i]) idx[kept++] = static_cast<uint8_t>(i);
    }
    const MinMax h = bad ? MinMax{nan_f32(), nan_f32()} : minmax_stats(x, idx, kept);
    store_f32_at(rec, h.min);
    store_f32_at(rec + 4, h.max);
    for (size_t j = 0; j < kept; ++j) rec[8 + j] = idx[j];
    uint8_t* codes = rec + 8 + s.k;
    const float step = minmax_step(h, b);
    for (size_t j = 0; j < kept; ++j) put_code(codes, j, b, minmax_code(x[idx[j]], h, step, b));
    return;
  }
  const MinMax h = minmax_stats(x, nullptr, len);
  store_f32_at(rec, h.min);
  store_f32_at(rec + 4, h.max);
  const float step = minmax_step(h, b);
  for (size_t i = 0; i < len; ++i) put_code(rec + 8, i, b, minmax_code(x[i], h, step, b));
}

// Decodes block record `rec` into out[0, len).
BAGUA_HD void decode_block(Spec s, const uint8_t* rec, size_t len, float* out) {
  const uint32_t b = bits(s);
  if (s.format == Format::kFp4E2M1) {
    const float scale = load_f32_at(rec);
    for (size_t i = 0; i < len; ++i) {
      const uint32_t c = get_code(rec + 4, i, 4);
      const float v = fp4_magnitude(c & 7u) * scale;
      out[i] = (c & 8u) ? -v : v;
    }
    return;
  }
  const MinMax h{load_f32_at(rec), load_f32_at(rec + 4)};
  const float step = minmax_step(h, b);
  if (is_topk(s)) {
    const bool bad = h.min != h.min;
    for (size_t i = 0; i < len; ++i) out[i] = bad ? nan_f32() : 0.0f;
    if (bad) return;
    const size_t kept = s.k < len ? s.k : len;
    const uint8_t* codes = rec + 8 + s.k;
    for (size_t j = 0; j < kept; ++j) out[rec[8 + j]] = minmax_value(get_code(codes, j, b), h, step);
    return;
  }
  for (size_t i = 0; i < len; ++i) out[i] = minmax_value(get_code(rec + 8, i, b), h, step);
}

// ---- residual --------------------------------------------------------------------------------
// e = x - x_hat, x_hat as the decompressed data stores it.
BAGUA_HD float residual(float x, float x_hat) { return x - x_hat; }
BAGUA_HD double residual(double x, float x_hat) { return x - static_cast<double>(x_hat); }
BAGUA_HD Half residual(Half x, float x_hat) { return to_half(to_float(x) - to_float(to_half(x_hat))); }
BAGUA_HD BFloat16 residual(BFloat16 x, float x_hat) { return to_bfloat16(to_float(x) - to_float(to_bfloat16(x_hat))); }

}  // namespace lowbit
}  // namespace bagua
