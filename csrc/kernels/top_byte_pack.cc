#include "kernels/top_byte_pack.h"

#include <algorithm>
#include <cstring>
#include <string>

#include "common/error.h"

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
  std::partial_sort(order, order + kEscape, order + 256, [&](uint8_t a, uint8_t b) {
    return total[a] != total[b] ? total[a] > total[b] : a < b;
  });
  for (int c = 0; c < kEscape; ++c) table[c] = order[c];
  table[kEscape] = 0;
}

inline void put_low3(uint8_t* dst, uint32_t v) {
  const uint8_t b[3] = {static_cast<uint8_t>(v), static_cast<uint8_t>(v >> 8), static_cast<uint8_t>(v >> 16)};
  std::memcpy(dst, b, 3);
}

inline uint32_t get_low3(const uint8_t* src) {
  return static_cast<uint32_t>(src[0]) | (static_cast<uint32_t>(src[1]) << 8) |
         (static_cast<uint32_t>(src[2]) << 16);
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
    throw Error("packed segment of " + std::to_string(n) + " values has " + std::to_string(escapes) +
                " escapes but " + std::to_string(bytes - fixed) + " escape bytes");
  return packed + fixed;
}

// Calls sink(i, bits) for every value of a checked segment, in order.
template <typename Sink>
void unpack_each(const uint8_t* packed, size_t bytes, size_t n, Sink&& sink) {
  const uint8_t* esc = check_segment(packed, bytes, n);
  const uint8_t* table = packed;
  const uint8_t* codes = packed + kTopByteTableBytes;
  const uint8_t* low = codes + (n + 1) / 2;
  auto top = [&](uint8_t c) -> uint32_t { return c == kEscape ? *esc++ : table[c]; };
  size_t i = 0;
  // Pairs whose 4-byte low loads stay inside the low bytes (not the last value).
  for (; i + 2 < n; i += 2) {
    const uint8_t code = codes[i / 2];
    uint32_t a, b;
    std::memcpy(&a, low + 3 * i, 4);
    std::memcpy(&b, low + 3 * i + 3, 4);
    sink(i, (a & 0xffffffu) | (top(code & 15) << 24));
    sink(i + 1, (b & 0xffffffu) | (top(code >> 4) << 24));
  }
  for (; i < n; ++i) {
    const uint8_t c = (codes[i / 2] >> ((i & 1) * 4)) & 15;
    sink(i, get_low3(low + 3 * i) | (top(c) << 24));
  }
}

}  // namespace

size_t top_byte_pack(const uint32_t* in, size_t n, uint8_t* out, size_t limit) {
  const size_t fixed = top_byte_packed_size(n, 0);
  if (n == 0 || fixed + 2 > limit) return 0;
  // Escapes allowed: the result must stay under `limit` with one byte to
  // spare, since an escape slot is stored before it is known to be needed.
  const size_t budget = limit - 2 - fixed;
  uint8_t table[kTopByteTableBytes];
  choose_table(in, n, table);
  uint8_t lut[256];
  std::memset(lut, kEscape, sizeof(lut));
  for (int c = kEscape - 1; c >= 0; --c) lut[table[c]] = static_cast<uint8_t>(c);
  std::memcpy(out, table, kTopByteTableBytes);
  uint8_t* codes = out + kTopByteTableBytes;
  uint8_t* low = codes + (n + 1) / 2;
  uint8_t* esc = low + 3 * n;
  size_t e = 0;
  size_t i = 0;
  // Two values per code byte. Each value's 4-byte store spills its top byte
  // into the next value's slot, which that value then overwrites; every
  // escape slot is stored unconditionally and kept only when used (e <= budget
  // keeps slots e and e + 1 inside `limit`).
  for (; i + 2 < n; i += 2) {
    const uint32_t a = in[i], b = in[i + 1];
    const uint8_t ta = static_cast<uint8_t>(a >> 24), tb = static_cast<uint8_t>(b >> 24);
    const uint8_t ca = lut[ta], cb = lut[tb];
    codes[i / 2] = static_cast<uint8_t>(ca | (cb << 4));
    std::memcpy(low + 3 * i, &a, 4);
    std::memcpy(low + 3 * i + 3, &b, 4);
    esc[e] = ta;
    e += ca == kEscape;
    esc[e] = tb;
    e += cb == kEscape;
    if (e > budget) return 0;
  }
  for (; i < n; ++i) {
    const uint8_t t = static_cast<uint8_t>(in[i] >> 24);
    const uint8_t c = lut[t];
    if (i % 2 == 0) {
      codes[i / 2] = c;
    } else {
      codes[i / 2] = static_cast<uint8_t>(codes[i / 2] | (c << 4));
    }
    put_low3(low + 3 * i, in[i]);
    if (c == kEscape) {
      if (e + 1 > budget) return 0;
      esc[e++] = t;
    }
  }
  return fixed + e;
}

void top_byte_unpack(const uint8_t* packed, size_t bytes, size_t n, uint32_t* out) {
  unpack_each(packed, bytes, n, [out](size_t i, uint32_t bits) { out[i] = bits; });
}

void top_byte_unpack_add(const uint8_t* packed, size_t bytes, size_t n, float* acc) {
  unpack_each(packed, bytes, n, [acc](size_t i, uint32_t bits) {
    float v;
    std::memcpy(&v, &bits, 4);
    acc[i] = acc[i] + v;
  });
}

}  // namespace bagua
