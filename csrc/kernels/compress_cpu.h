// MinMaxUInt8 compression on host memory (layout and math: kernels/minmax_uint8.h), plus the
// argument checks and dtype dispatch shared with the CUDA launchers (kernels/compress_cuda.h).
// Single-threaded; callers may run it on any thread.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "common/dtype.h"
#include "common/error.h"
#include "kernels/half.h"

namespace bagua {
namespace minmax_uint8 {

// Throws InvalidArgument unless dtype is a floating type, n_chunks >= 1, n % n_chunks == 0 and
// target_chunk is -1 (all chunks) or a chunk index.
void check_compress_args(size_t n, DType dtype, size_t n_chunks, int64_t target_chunk);
// Throws InvalidArgument unless dtype is a floating type and n_records >= 1.
void check_reduce_args(size_t chunk_len, size_t n_records, DType dtype);

// Compresses src (n elements of dtype) into dst (compressed_size(n, n_chunks) bytes): every chunk,
// or only chunk target_chunk (the other records of dst are left untouched).
void compress_cpu(const void* src, size_t n, DType dtype, size_t n_chunks, void* dst, int64_t target_chunk = -1);

// Decodes src (compressed_size(n, n_chunks) bytes) into dst (n elements of dtype): every chunk, or
// only chunk target_chunk (written at its place in dst; the rest of dst is left untouched).
void decompress_cpu(const void* src, size_t n, DType dtype, size_t n_chunks, void* dst, int64_t target_chunk = -1);

// The quantisation residual of x (n elements of dtype) against its records src
// (compressed_size(n, n_chunks) bytes): e = x - decompress(src), element math `residual` of
// minmax_uint8.h, written to e (n elements): every chunk, or only chunk target_chunk.
void residual_cpu(const void* src, const void* x, size_t n, DType dtype, size_t n_chunks, void* e,
                  int64_t target_chunk = -1);

// Decodes n_records records of chunk_len codes each (src: n_records * record_bytes(chunk_len) bytes),
// sums them element-wise in float32 (record 0 first), divides by n_records when average, and
// writes chunk_len elements of dtype to dst.
void reduce_chunks_cpu(const void* src, size_t chunk_len, size_t n_records, DType dtype, bool average, void* dst);

// Calls f with a value of the C++ element type of a floating dtype; InvalidArgument otherwise.
template <typename F>
void dispatch_float_dtype(DType dtype, F&& f) {
  switch (dtype) {
    case DType::kFloat32: f(float{}); return;
    case DType::kFloat64: f(double{}); return;
    case DType::kFloat16: f(Half{}); return;
    case DType::kBFloat16: f(BFloat16{}); return;
    default:
      throw InvalidArgument(
          std::string("MinMaxUInt8 compression needs float32, float64, float16 or bfloat16 data, got ") +
          dtype_name(dtype));
  }
}

}  // namespace minmax_uint8
}  // namespace bagua
