#include "kernels/top_byte_pack.h"

#include <algorithm>
#include <cstring>
#include <string>

#include "common/error.h"
#include "kernels/cpu_isa.h"

#if defined(__x86_64__)
#include <immintrin.h>
#endif

namespace bagua {
namespace {

constexpr uint8_t kEscape = 15;

// The 15 most frequent top bytes (ties: the smaller byte) of a sample: every
// value of short segments, every kSampleStride-th of long ones (the table only
// decides the size, never the bits). Four count tables let consecutive
// increments proceed independently.
constexpr size_t kSampleStride = 8;
constexpr size_t kSampleAllBelow = 4096;

void choose_table(const uint32_t* in, size_t n, uint8_t table[kTopByteTableBytes]) {
  const size_t stride = n < kSampleAllBelow ? 1 : kSampleStride;
  uint32_t counts[4][256] = {};
  size_t i = 0;
  for (; i + 3 * stride < n; i += 4 * stride) {
    ++counts[0][in[i] >> 24];
    ++counts[1][in[i + stride] >> 24];
    ++counts[2][in[i + 2 * stride] >> 24];
    ++counts[3][in[i + 3 * stride] >> 24];
  }
  for (; i < n; i += stride) ++counts[0][in[i] >> 24];
  uint32_t total[256];
  for (int b = 0; b < 256; ++b) total[b] = counts[0][b] + counts[1][b] + counts[2][b] + counts[3][b];
  uint8_t order[256];
  for (int b = 0; b < 256; ++b) order[b] = static_cast<uint8_t>(b);
  std::partial_sort(order, order + kEscape, order + 256,
                    [&](uint8_t a, uint8_t b) { return total[a] != total[b] ? total[a] > total[b] : a < b; });
  for (int c = 0; c < kEscape; ++c) table[c] = order[c];
  table[kEscape] = 0;
}

inline void put_low3(uint8_t* dst, uint32_t v) {
  const uint8_t b[3] = {static_cast<uint8_t>(v), static_cast<uint8_t>(v >> 8), static_cast<uint8_t>(v >> 16)};
  std::memcpy(dst, b, 3);
}

inline uint32_t get_low3(const uint8_t* src) {
  return static_cast<uint32_t>(src[0]) | (static_cast<uint32_t>(src[1]) << 8) | (static_cast<uint32_t>(src[2]) << 16);
}

// Checks the segment's size against its codes; returns where the escapes start.
const uint8_t* check_segment(const uint8_t* packed, size_t bytes, size_t n) {
  const size_t fixed = top_byte_packed_size(n, 0);
  if (bytes < fixed)
    throw Error("packed segment of " + std::to_string(n) + " values is " + std::to_string(bytes) +
                " bytes, shorter than its fixed part (" + std::to_string(fixed) + ")");
  const uint8_t* codes = packed + kTopByteTableBytes;
  size_t escapes = 0;
  for (size_t k = 0; k < n / 2; ++k) escapes += ((codes[k] & 15) == kEscape) + ((codes[k] >> 4) == kEscape);
  if (n % 2) escapes += (codes[n / 2] & 15) == kEscape;
  if (bytes != fixed + escapes)
    throw Error("packed segment of " + std::to_string(n) + " values has " + std::to_string(escapes) + " escapes but " +
                std::to_string(bytes - fixed) + " escape bytes");
  return packed + fixed;
}

// Where a checked segment's parts start; `esc` advances past each escape read.
struct Reader {
  const uint8_t* table;
  const uint8_t* codes;
  const uint8_t* low;
  const uint8_t* esc;
};

inline uint8_t code_of(const uint8_t* codes, size_t i) { return (codes[i / 2] >> ((i & 1) * 4)) & 15; }

// Calls sink(i, bits) for values [i, end) of a checked segment, in order.
template <typename Sink>
void unpack_range(Reader& r, size_t i, size_t end, size_t n, Sink&& sink) {
  auto top = [&](uint8_t c) -> uint32_t { return c == kEscape ? *r.esc++ : r.table[c]; };
  // Pairs whose 4-byte low loads stay inside the low bytes (not the last value).
  for (; i + 2 <= end && i + 2 < n && i % 2 == 0; i += 2) {
    const uint8_t code = r.codes[i / 2];
    uint32_t a, b;
    std::memcpy(&a, r.low + 3 * i, 4);
    std::memcpy(&b, r.low + 3 * i + 3, 4);
    sink(i, (a & 0xffffffu) | (top(code & 15) << 24));
    sink(i + 1, (b & 0xffffffu) | (top(code >> 4) << 24));
  }
  for (; i < end; ++i) sink(i, get_low3(r.low + 3 * i) | (top(code_of(r.codes, i)) << 24));
}

// Value k of an unpacked segment: its bits into dst, or (kAdd) added to the float32 there.
template <bool kAdd>
inline void put_bits(void* dst, size_t k, uint32_t bits) {
  if (kAdd) {
    float v;
    std::memcpy(&v, &bits, 4);
    static_cast<float*>(dst)[k] += v;
  } else {
    static_cast<uint32_t*>(dst)[k] = bits;
  }
}

#if defined(__x86_64__)
// Whether any of the 8 nibbles of w is 15 (an escape).
inline bool has_escape(uint32_t w) { return (w & (w >> 1) & (w >> 2) & (w >> 3) & 0x11111111u) != 0; }

// Values [0, end) 8 at a time (end: a multiple of 8 whose last 16-byte low
// load stays inside the segment); groups with an escape go value by value.
// Returns where it stopped. kAdd: acc += value as float32, else out = bits.
template <bool kAdd>
__attribute__((target("avx2"))) size_t unpack_avx2(Reader& r, size_t n, void* dst) {
  const size_t end = n >= 10 ? ((n - 10) / 8) * 8 : 0;
  const __m128i table = _mm_loadu_si128(reinterpret_cast<const __m128i*>(r.table));
  const __m128i nibble = _mm_set1_epi8(0x0f);
  const __m256i spread = _mm256_setr_epi8(0, 1, 2, -1, 3, 4, 5, -1, 6, 7, 8, -1, 9, 10, 11, -1,  //
                                          0, 1, 2, -1, 3, 4, 5, -1, 6, 7, 8, -1, 9, 10, 11, -1);
  auto* out = static_cast<uint32_t*>(dst);
  auto* acc = static_cast<float*>(dst);
  for (size_t i = 0; i < end; i += 8) {
    uint32_t w;
    std::memcpy(&w, r.codes + i / 2, 4);
    if (has_escape(w)) {
      unpack_range(r, i, i + 8, n, [&](size_t k, uint32_t bits) { put_bits<kAdd>(dst, k, bits); });
      continue;
    }
    const __m128i c = _mm_cvtsi32_si128(static_cast<int>(w));
    const __m128i codes = _mm_unpacklo_epi8(_mm_and_si128(c, nibble), _mm_and_si128(_mm_srli_epi16(c, 4), nibble));
    const __m256i top = _mm256_slli_epi32(_mm256_cvtepu8_epi32(_mm_shuffle_epi8(table, codes)), 24);
    const __m256i low =
        _mm256_shuffle_epi8(_mm256_set_m128i(_mm_loadu_si128(reinterpret_cast<const __m128i*>(r.low + 3 * i + 12)),
                                             _mm_loadu_si128(reinterpret_cast<const __m128i*>(r.low + 3 * i))),
                            spread);
    const __m256i bits = _mm256_or_si256(low, top);
    if (kAdd) {
      __m256 a = _mm256_loadu_ps(acc + i);
      _mm256_storeu_ps(acc + i, _mm256_add_ps(a, _mm256_castsi256_ps(bits)));
    } else {
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(out + i), bits);
    }
  }
  return end;
}
#endif

template <bool kAdd>
void unpack_segment(const uint8_t* packed, size_t bytes, size_t n, void* dst) {
  Reader r{packed, packed + kTopByteTableBytes, packed + kTopByteTableBytes + (n + 1) / 2,
           check_segment(packed, bytes, n)};
  size_t i = 0;
#if defined(__x86_64__)
  if (cpu_isa() != CpuIsa::kBaseline) i = unpack_avx2<kAdd>(r, n, dst);
#endif
  unpack_range(r, i, n, n, [&](size_t k, uint32_t bits) { put_bits<kAdd>(dst, k, bits); });
}

}  // namespace

namespace {

struct Writer {
  const uint8_t* lut;
  uint8_t* codes;
  uint8_t* low;
  uint8_t* esc;
  size_t e;       // escapes written
  size_t budget;  // escapes allowed
};

// Values [i, end) of `in`, i even, end <= n - 1 or end == n handled by the
// caller's tail. Each value's 4-byte store spills its top byte into the next
// value's slot, which that value then overwrites; every escape slot is stored
// unconditionally and kept only when used (e <= budget keeps slots e and
// e + 1 inside the limit). Returns false when the escapes exceed the budget.
bool pack_pairs(Writer& w, const uint32_t* in, size_t i, size_t end) {
  for (; i < end; i += 2) {
    const uint32_t a = in[i], b = in[i + 1];
    const uint8_t ta = static_cast<uint8_t>(a >> 24), tb = static_cast<uint8_t>(b >> 24);
    const uint8_t ca = w.lut[ta], cb = w.lut[tb];
    w.codes[i / 2] = static_cast<uint8_t>(ca | (cb << 4));
    std::memcpy(w.low + 3 * i, &a, 4);
    std::memcpy(w.low + 3 * i + 3, &b, 4);
    w.esc[w.e] = ta;
    w.e += ca == kEscape;
    w.esc[w.e] = tb;
    w.e += cb == kEscape;
    if (w.e > w.budget) return false;
  }
  return true;
}

#if defined(__x86_64__)
// Groups of 8 values while their 16-byte low stores stay inside the low
// bytes; a group with an escape goes through pack_pairs. Returns where it
// stopped, or SIZE_MAX when the escapes exceed the budget.
__attribute__((target("avx2"))) size_t pack_avx2(Writer& w, const uint32_t* in, size_t n, const int32_t* lut32) {
  const size_t end = n >= 10 ? ((n - 10) / 8) * 8 : 0;
  const __m256i escape = _mm256_set1_epi32(kEscape);
  const __m256i squeeze = _mm256_setr_epi8(0, 1, 2, 4, 5, 6, 8, 9, 10, 12, 13, 14, -1, -1, -1, -1,  //
                                           0, 1, 2, 4, 5, 6, 8, 9, 10, 12, 13, 14, -1, -1, -1, -1);
  const __m256i pick = _mm256_setr_epi8(0, 8, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1,  //
                                        0, 8, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1);
  for (size_t i = 0; i < end; i += 8) {
    const __m256i v = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(in + i));
    const __m256i codes = _mm256_i32gather_epi32(lut32, _mm256_srli_epi32(v, 24), 4);
    if (_mm256_movemask_epi8(_mm256_cmpeq_epi32(codes, escape)) != 0) {
      if (!pack_pairs(w, in, i, i + 8)) return SIZE_MAX;
      continue;
    }
    // Byte 0 of each 64-bit lane: even value's code | odd value's code << 4.
    const __m256i pairs = _mm256_shuffle_epi8(_mm256_or_si256(codes, _mm256_srli_epi64(codes, 28)), pick);
    const uint32_t lo = static_cast<uint32_t>(_mm_cvtsi128_si32(_mm256_castsi256_si128(pairs))) & 0xffffu;
    const uint32_t hi = static_cast<uint32_t>(_mm_cvtsi128_si32(_mm256_extracti128_si256(pairs, 1))) & 0xffffu;
    const uint32_t word = lo | (hi << 16);
    std::memcpy(w.codes + i / 2, &word, 4);
    const __m256i low = _mm256_shuffle_epi8(v, squeeze);
    _mm_storeu_si128(reinterpret_cast<__m128i*>(w.low + 3 * i), _mm256_castsi256_si128(low));
    _mm_storeu_si128(reinterpret_cast<__m128i*>(w.low + 3 * i + 12), _mm256_extracti128_si256(low, 1));
  }
  return end;
}
#endif

}  // namespace

size_t top_byte_pack(const uint32_t* in, size_t n, uint8_t* out, size_t limit) {
  const size_t fixed = top_byte_packed_size(n, 0);
  if (n == 0 || fixed + 2 > limit) return 0;
  uint8_t table[kTopByteTableBytes];
  choose_table(in, n, table);
  uint8_t lut[256];
  std::memset(lut, kEscape, sizeof(lut));
  for (int c = kEscape - 1; c >= 0; --c) lut[table[c]] = static_cast<uint8_t>(c);
  std::memcpy(out, table, kTopByteTableBytes);
  uint8_t* codes = out + kTopByteTableBytes;
  uint8_t* low = codes + (n + 1) / 2;
  // Escapes allowed: the result stays under `limit` with one byte to spare.
  Writer w{lut, codes, low, low + 3 * n, 0, limit - 2 - fixed};
  size_t i = 0;
#if defined(__x86_64__)
  if (cpu_isa() != CpuIsa::kBaseline) {
    int32_t lut32[256];
    for (int b = 0; b < 256; ++b) lut32[b] = lut[b];
    i = pack_avx2(w, in, n, lut32);
    if (i == SIZE_MAX) return 0;
  }
#endif
  // Pairs except the last value, whose 4-byte store would leave the low bytes.
  const size_t pairs_end = n >= 1 ? ((n - 1) / 2) * 2 : 0;
  if (i < pairs_end && !pack_pairs(w, in, i, pairs_end)) return 0;
  for (i = std::max(i, pairs_end); i < n; ++i) {
    const uint8_t t = static_cast<uint8_t>(in[i] >> 24);
    const uint8_t c = lut[t];
    if (i % 2 == 0) {
      w.codes[i / 2] = c;
    } else {
      w.codes[i / 2] = static_cast<uint8_t>(w.codes[i / 2] | (c << 4));
    }
    put_low3(w.low + 3 * i, in[i]);
    if (c == kEscape) {
      if (w.e + 1 > w.budget) return 0;
      w.esc[w.e++] = t;
    }
  }
  return fixed + w.e;
}

void top_byte_unpack(const uint8_t* packed, size_t bytes, size_t n, uint32_t* out) {
  unpack_segment<false>(packed, bytes, n, out);
}

void top_byte_unpack_add(const uint8_t* packed, size_t bytes, size_t n, float* acc) {
  unpack_segment<true>(packed, bytes, n, acc);
}

}  // namespace bagua
