// Lossless packing of float32 bit patterns for slow links ("top-byte packing").
//
// A float32's top byte (sign + 7 high exponent bits) takes few values in a
// gradient (2.7-2.9 bits of entropy measured on an MLP), its low 3 bytes look
// random. So each value keeps its low 3 bytes as they are and its top byte
// becomes a 4-bit code into a table of the segment's 15 most frequent top
// bytes; code 15 escapes to the raw byte. Unpacking gives back the exact bits
// (NaN payloads, infinities, -0.0 and denormals included): nothing is
// interpreted as a number.
//
// Layout of a packed segment of n values (n known to the reader):
//   [0, 16)            table: byte c (c < 15) is the top byte of code c; byte 15 is 0
//   [16, 16 + C)       codes, C = ceil(n / 2): value i's code is the low nibble
//                      of byte i / 2 when i is even, the high nibble when odd
//                      (the unused high nibble of an odd n is 0)
//   [16 + C, L)        low 3 bytes of each value, little-endian, in value order;
//                      L = 16 + C + 3 n
//   [L, L + e)         the top bytes of the escaped values (code 15), in value order
// Size: 16 + ceil(n / 2) + 3 n + e bytes, e = number of escaped values.
#pragma once

#include <cstddef>
#include <cstdint>

namespace bagua {

constexpr size_t kTopByteTableBytes = 16;

// Bytes top_byte_pack writes for `n` values with `escapes` escaped ones.
inline size_t top_byte_packed_size(size_t n, size_t escapes) {
  return kTopByteTableBytes + (n + 1) / 2 + 3 * n + escapes;
}

// Packs n values into `out` if the result takes at most limit - 2 bytes and
// returns its size; otherwise returns 0 (`out` may have been written). `out`
// must hold `limit` bytes (a limit of 4 n: "only when it is smaller than the
// raw bytes"). The table comes from a sample of the values (every 8th of
// segments of 4096 values or more): it decides the size, never the bits.
size_t top_byte_pack(const uint32_t* in, size_t n, uint8_t* out, size_t limit);

// Unpacks a segment of n values written by top_byte_pack (`bytes` long, which
// is checked against the escape count: a mismatch throws bagua::Error).
void top_byte_unpack(const uint8_t* packed, size_t bytes, size_t n, uint32_t* out);

// acc[i] = acc[i] + value i of the packed segment, as float32 (the SUM of
// kernels/reduce.h). Same checks as top_byte_unpack.
void top_byte_unpack_add(const uint8_t* packed, size_t bytes, size_t n, float* acc);

}  // namespace bagua
