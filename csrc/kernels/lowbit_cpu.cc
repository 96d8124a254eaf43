// Host loops of the low-bit block codecs over the block functions of lowbit.h: each block is
// loaded into float32, coded on its own and stored; no FMA contraction (the CUDA build has none
// either), so both devices give the same bits.
#if defined(__clang__)
#pragma clang fp contract(off)
#elif defined(__GNUC__)
#pragma GCC optimize("fp-contract=off")
#endif
#include "kernels/lowbit_cpu.h"

#include <cmath>
#include <string>
#include <type_traits>
#include <vector>

#include "common/error.h"
#include "kernels/compress_cpu.h"

namespace bagua {
namespace lowbit {
namespace {

void chunk_range(size_t n_chunks, int64_t target_chunk, size_t* first, size_t* last) {
  *first = target_chunk < 0 ? 0 : static_cast<size_t>(target_chunk);
  *last = target_chunk < 0 ? n_chunks : *first + 1;
}

// Calls f(chunk index k, block index j, element offset in the chunk, block length) for every block
// of the chosen chunks.
template <typename F>
void for_each_block(Spec spec, size_t n, size_t n_chunks, int64_t target_chunk, F&& f) {
  const size_t len = n / n_chunks;
  const size_t bl = block_len(spec);
  size_t first, last;
  chunk_range(n_chunks, target_chunk, &first, &last);
  for (size_t k = first; k < last; ++k)
    for (size_t j = 0, off = 0; off < len; ++j, off += bl) f(k, j, off, len - off < bl ? len - off : bl);
}

uint8_t* block_ptr(void* base, Spec spec, size_t chunk_len, size_t k, size_t j) {
  return static_cast<uint8_t*>(base) + k * record_bytes(spec, chunk_len) + j * block_bytes(spec);
}
const uint8_t* block_ptr(const void* base, Spec spec, size_t chunk_len, size_t k, size_t j) {
  return static_cast<const uint8_t*>(base) + k * record_bytes(spec, chunk_len) + j * block_bytes(spec);
}

}  // namespace

void check_spec(Spec spec) {
  switch (spec.format) {
    case Format::kMinmax4:
    case Format::kMinmax2:
    case Format::kFp4E2M1: return;
    case Format::kTopk4:
    case Format::kTopk2:
      if (spec.k < 1 || spec.k > kTopkBlock)
        throw InvalidArgument("top-k codec: k must be in [1, 256] per block of 256, got " + std::to_string(spec.k));
      return;
  }
  throw InvalidArgument("low-bit codec: unknown format " + std::to_string(static_cast<int>(spec.format)));
}

void check_compress_args(Spec spec, size_t n, DType dtype, size_t n_chunks, int64_t target_chunk) {
  check_spec(spec);
  minmax_uint8::check_compress_args(n, dtype, n_chunks, target_chunk);
}

void compress_cpu(Spec spec, const void* src, size_t n, DType dtype, size_t n_chunks, void* dst, int64_t target_chunk) {
  check_compress_args(spec, n, dtype, n_chunks, target_chunk);
  const size_t len = n / n_chunks;
  minmax_uint8::dispatch_float_dtype(dtype, [&](auto tag) {
    using T = decltype(tag);
    const T* x = static_cast<const T*>(src);
    float buf[kMaxBlock];
    for_each_block(spec, n, n_chunks, target_chunk, [&](size_t k, size_t j, size_t off, size_t bl) {
      const T* in = x + k * len + off;
      for (size_t i = 0; i < bl; ++i) buf[i] = load_f32(in[i]);
      encode_block(spec, buf, bl, block_ptr(dst, spec, len, k, j));
    });
    // the padding after each chunk's last block
    size_t first, last;
    chunk_range(n_chunks, target_chunk, &first, &last);
    const size_t used = n_blocks(spec, len) * block_bytes(spec);
    for (size_t k = first; k < last; ++k) {
      uint8_t* rec = static_cast<uint8_t*>(dst) + k * record_bytes(spec, len);
      for (size_t b = used; b < record_bytes(spec, len); ++b) rec[b] = 0u;
    }
  });
}

void decompress_cpu(Spec spec, const void* src, size_t n, DType dtype, size_t n_chunks, void* dst,
                    int64_t target_chunk) {
  check_compress_args(spec, n, dtype, n_chunks, target_chunk);
  const size_t len = n / n_chunks;
  minmax_uint8::dispatch_float_dtype(dtype, [&](auto tag) {
    using T = decltype(tag);
    T* out = static_cast<T*>(dst);
    float buf[kMaxBlock];
    for_each_block(spec, n, n_chunks, target_chunk, [&](size_t k, size_t j, size_t off, size_t bl) {
      decode_block(spec, block_ptr(src, spec, len, k, j), bl, buf);
      T* o = out + k * len + off;
      for (size_t i = 0; i < bl; ++i) o[i] = store_f32<T>(buf[i]);
    });
  });
}

void residual_cpu(Spec spec, const void* src, const void* x, size_t n, DType dtype, size_t n_chunks, void* e,
                  int64_t target_chunk) {
  check_compress_args(spec, n, dtype, n_chunks, target_chunk);
  const size_t len = n / n_chunks;
  minmax_uint8::dispatch_float_dtype(dtype, [&](auto tag) {
    using T = decltype(tag);
    const T* xs = static_cast<const T*>(x);
    T* out = static_cast<T*>(e);
    float buf[kMaxBlock];
    for_each_block(spec, n, n_chunks, target_chunk, [&](size_t k, size_t j, size_t off, size_t bl) {
      decode_block(spec, block_ptr(src, spec, len, k, j), bl, buf);
      const size_t at = k * len + off;
      for (size_t i = 0; i < bl; ++i) out[at + i] = residual(xs[at + i], buf[i]);
    });
  });
}

void reduce_chunks_cpu(Spec spec, const void* src, size_t chunk_len, size_t n_records, DType dtype, bool average,
                       void* dst) {
  check_spec(spec);
  minmax_uint8::check_reduce_args(chunk_len, n_records, dtype);
  const float divisor = average ? static_cast<float>(n_records) : 1.0f;
  minmax_uint8::dispatch_float_dtype(dtype, [&](auto tag) {
    using T = decltype(tag);
    T* out = static_cast<T*>(dst);
    float buf[kMaxBlock];
    float acc[kMaxBlock];
    for_each_block(spec, chunk_len, 1, -1, [&](size_t, size_t j, size_t off, size_t bl) {
      for (size_t i = 0; i < bl; ++i) acc[i] = 0.0f;
      for (size_t r = 0; r < n_records; ++r) {
        decode_block(spec, block_ptr(src, spec, chunk_len, r, j), bl, buf);
        for (size_t i = 0; i < bl; ++i) acc[i] += buf[i];
      }
      for (size_t i = 0; i < bl; ++i) out[off + i] = store_f32<T>(average ? acc[i] / divisor : acc[i]);
    });
  });
}

size_t count_nonfinite_cpu(const void* x, size_t n, DType dtype) {
  size_t bad = 0;
  minmax_uint8::dispatch_float_dtype(dtype, [&](auto tag) {
    using T = decltype(tag);
    const T* xs = static_cast<const T*>(x);
    for (size_t i = 0; i < n; ++i) {
      if constexpr (std::is_same_v<T, double>)
        bad += !std::isfinite(xs[i]);
      else
        bad += non_finite(load_f32(xs[i]));
    }
  });
  return bad;
}

}  // namespace lowbit
}  // namespace bagua
