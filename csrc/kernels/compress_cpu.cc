// Host loops of MinMaxUInt8 compression over the element functions of minmax_uint8.h.
// Each loop is dispatched on the dtype once and on the instruction set (kernels/cpu_isa.h) per chunk
// or tile; the loops themselves are in compress_cpu_loops.inc, compiled once per instruction set.
//
// GCC if-converts (and so vectorises) the float selects of the element math only when it may
// assume that float compares raise no trap; this changes no value, and nothing here reads the
// floating-point exception flags. Contracting a*b+c into an FMA would change values (round_even
// relies on x * scale being rounded before 2^23 is added), so it is off, as it is in the CUDA code.
#if defined(__clang__)
#pragma clang fp contract(off)
#elif defined(__GNUC__)
#pragma GCC optimize("no-trapping-math", "fp-contract=off")
#endif
#include "kernels/compress_cpu.h"

#include <cstring>
#include <vector>

#include "kernels/cpu_isa.h"
#include "kernels/minmax_uint8.h"

// AVX2 and AVX-512 copies of the loops (GCC/clang target attributes on x86-64); AVX2 also has
// float32 statistics and encoding written with intrinsics (compress_cpu_avx2_f32.inc).

namespace bagua {
namespace minmax_uint8 {
namespace {

#define BAGUA_ISA_LOOPS "kernels/compress_cpu_loops.inc"
#define BAGUA_ISA_AVX2_EXTRA "kernels/compress_cpu_avx2_f32.inc"
#include "kernels/cpu_isa_copies.h"

// The copy of a loop for the ISA in use is chosen per chunk or tile (BAGUA_ISA_CALL), a negligible cost.

template <typename T>
Stats chunk_stats(const T* x, size_t len) {
  BAGUA_ISA_CALL(chunk_stats, x, len)
}

template <typename T>
void encode_codes(const T* x, size_t len, Encoder e, uint8_t* codes) {
  BAGUA_ISA_CALL(encode_codes, x, len, e, codes)
}

template <typename T>
void decode_codes(const uint8_t* codes, size_t len, Decoder d, T* out) {
  BAGUA_ISA_CALL(decode_codes, codes, len, d, out)
}

template <typename T>
void residual_codes(const uint8_t* codes, size_t len, Decoder d, const T* x, T* e) {
  BAGUA_ISA_CALL(residual_codes, codes, len, d, x, e)
}

void accumulate_codes(const uint8_t* codes, size_t len, Decoder d, float* acc) {
  BAGUA_ISA_CALL(accumulate_codes, codes, len, d, acc)
}

template <typename T>
void store_sums(const float* acc, size_t len, float divisor, T* out){BAGUA_ISA_CALL(store_sums, acc, len, divisor, out)}

Header read_header(const uint8_t* record) {
  Header h;
  std::memcpy(&h, record, sizeof(h));
  return h;
}

template <typename T>
void compress_chunk(const T* x, size_t len, uint8_t* record) {
  const Header h = make_header(chunk_stats(x, len));
  std::memcpy(record, &h, sizeof(h));
  encode_codes(x, len, make_encoder(h.min, h.max), record + kHeaderBytes);
  std::memset(record + kHeaderBytes + len, 0, record_bytes(len) - kHeaderBytes - len);
}

template <typename T>
void reduce_chunks_typed(const uint8_t* src, size_t chunk_len, size_t n_records, bool average, T* out) {
  std::vector<Decoder> decoders(n_records);
  for (size_t r = 0; r < n_records; ++r) {
    const Header h = read_header(record_ptr(src, chunk_len, r));
    decoders[r] = make_decoder(h.min, h.max);
  }
  const float divisor = average ? static_cast<float>(n_records) : 1.0f;
  constexpr size_t kTile = 2048;  // float32 sums of one tile stay in L1
  float acc[kTile];
  for (size_t t0 = 0; t0 < chunk_len; t0 += kTile) {
    const size_t tl = chunk_len - t0 < kTile ? chunk_len - t0 : kTile;
    for (size_t i = 0; i < tl; ++i) acc[i] = 0.0f;
    for (size_t r = 0; r < n_records; ++r)
      accumulate_codes(record_ptr(src, chunk_len, r) + kHeaderBytes + t0, tl, decoders[r], acc);
    store_sums(acc, tl, divisor, out + t0);
  }
}

void chunk_range(size_t n_chunks, int64_t target_chunk, size_t* first, size_t* last) {
  *first = target_chunk < 0 ? 0 : static_cast<size_t>(target_chunk);
  *last = target_chunk < 0 ? n_chunks : *first + 1;
}

}  // namespace

void check_compress_args(size_t n, DType dtype, size_t n_chunks, int64_t target_chunk) {
  dispatch_float_dtype(dtype, [](auto) {});
  if (n_chunks == 0) throw InvalidArgument("MinMaxUInt8: n_chunks must be at least 1");
  if (n % n_chunks != 0)
    throw InvalidArgument("MinMaxUInt8: number of elements " + std::to_string(n) + " is not divisible by n_chunks " +
                          std::to_string(n_chunks));
  if (target_chunk < -1 || (target_chunk >= 0 && static_cast<size_t>(target_chunk) >= n_chunks))
    throw InvalidArgument("MinMaxUInt8: target_chunk " + std::to_string(target_chunk) +
                          " is neither -1 (all chunks) nor a chunk index below " + std::to_string(n_chunks));
}

void check_reduce_args(size_t /*chunk_len*/, size_t n_records, DType dtype) {
  dispatch_float_dtype(dtype, [](auto) {});
  if (n_records == 0) throw InvalidArgument("MinMaxUInt8: reduce_chunks needs at least one record");
}

void compress_cpu(const void* src, size_t n, DType dtype, size_t n_chunks, void* dst, int64_t target_chunk) {
  check_compress_args(n, dtype, n_chunks, target_chunk);
  const size_t len = n / n_chunks;
  size_t first, last;
  chunk_range(n_chunks, target_chunk, &first, &last);
  dispatch_float_dtype(dtype, [&](auto tag) {
    using T = decltype(tag);
    const T* x = static_cast<const T*>(src);
    for (size_t k = first; k < last; ++k) compress_chunk(x + k * len, len, record_ptr(dst, len, k));
  });
}

void decompress_cpu(const void* src, size_t n, DType dtype, size_t n_chunks, void* dst, int64_t target_chunk) {
  check_compress_args(n, dtype, n_chunks, target_chunk);
  const size_t len = n / n_chunks;
  size_t first, last;
  chunk_range(n_chunks, target_chunk, &first, &last);
  dispatch_float_dtype(dtype, [&](auto tag) {
    using T = decltype(tag);
    T* out = static_cast<T*>(dst);
    for (size_t k = first; k < last; ++k) {
      const uint8_t* record = record_ptr(src, len, k);
      const Header h = read_header(record);
      decode_codes(record + kHeaderBytes, len, make_decoder(h.min, h.max), out + k * len);
    }
  });
}

void residual_cpu(const void* src, const void* x, size_t n, DType dtype, size_t n_chunks, void* e,
                  int64_t target_chunk) {
  check_compress_args(n, dtype, n_chunks, target_chunk);
  const size_t len = n / n_chunks;
  size_t first, last;
  chunk_range(n_chunks, target_chunk, &first, &last);
  dispatch_float_dtype(dtype, [&](auto tag) {
    using T = decltype(tag);
    const T* xs = static_cast<const T*>(x);
    T* out = static_cast<T*>(e);
    for (size_t k = first; k < last; ++k) {
      const uint8_t* record = record_ptr(src, len, k);
      const Header h = read_header(record);
      residual_codes(record + kHeaderBytes, len, make_decoder(h.min, h.max), xs + k * len, out + k * len);
    }
  });
}

void reduce_chunks_cpu(const void* src, size_t chunk_len, size_t n_records, DType dtype, bool average, void* dst) {
  check_reduce_args(chunk_len, n_records, dtype);
  dispatch_float_dtype(dtype, [&](auto tag) {
    using T = decltype(tag);
    reduce_chunks_typed(static_cast<const uint8_t*>(src), chunk_len, n_records, average, static_cast<T*>(dst));
  });
}

}  // namespace minmax_uint8
}  // namespace bagua
