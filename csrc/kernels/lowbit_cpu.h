// Low-bit block codecs on host memory (layout and math: kernels/lowbit.h), plus the argument
// checks shared with the CUDA launchers (kernels/lowbit_cuda.h). Same contracts as the
// MinMaxUInt8 host functions (kernels/compress_cpu.h): n % n_chunks == 0, target_chunk -1 or a
// chunk index, a floating dtype. Single-threaded; callers may run them on any thread.
#pragma once

#include <cstddef>
#include <cstdint>

#include "common/dtype.h"
#include "kernels/lowbit.h"

namespace bagua {
namespace lowbit {

// Throws InvalidArgument unless the format is known and, for top-k, 1 <= k <= 256.
void check_spec(Spec spec);
// check_spec, and as minmax_uint8::check_compress_args.
void check_compress_args(Spec spec, size_t n, DType dtype, size_t n_chunks, int64_t target_chunk);

void compress_cpu(Spec spec, const void* src, size_t n, DType dtype, size_t n_chunks, void* dst,
                  int64_t target_chunk = -1);
void decompress_cpu(Spec spec, const void* src, size_t n, DType dtype, size_t n_chunks, void* dst,
                    int64_t target_chunk = -1);
// e = x - decompress(src), every chunk or only target_chunk.
void residual_cpu(Spec spec, const void* src, const void* x, size_t n, DType dtype, size_t n_chunks, void* e,
                  int64_t target_chunk = -1);
// Decodes n_records records of one chunk (src: n_records * record_bytes(spec, chunk_len) bytes), sums
// them in float32 (record 0 first), divides by n_records when average, writes chunk_len elements.
void reduce_chunks_cpu(Spec spec, const void* src, size_t chunk_len, size_t n_records, DType dtype, bool average,
                       void* dst);

// How many of x's n elements are NaN or +-Inf (float64 values beyond float32's range count as finite).
size_t count_nonfinite_cpu(const void* x, size_t n, DType dtype);

}  // namespace lowbit
}  // namespace bagua
