// MinMaxUInt8 compression on device memory (layout and math: kernels/minmax_uint8.h), same
// arguments and same results as the host versions in kernels/compress_cpu.h. Declared only in builds
// with CUDA (BAGUA_WITH_CUDA), so host-only code cannot call them by mistake.
//
// Each launcher enqueues its kernels on `stream` (a cudaStream_t; nullptr = the legacy default
// stream) and returns without synchronising. Pointers are device pointers; src and dst must be
// 4-byte aligned. Argument errors raise InvalidArgument; launch failures raise bagua::Error.
#pragma once

#ifdef BAGUA_WITH_CUDA

#include <cstddef>
#include <cstdint>

#include "common/dtype.h"

namespace bagua {
namespace minmax_uint8 {

void compress_cuda(const void* src, size_t n, DType dtype, size_t n_chunks, void* dst, int64_t target_chunk,
                   void* stream);

void decompress_cuda(const void* src, size_t n, DType dtype, size_t n_chunks, void* dst, int64_t target_chunk,
                     void* stream);

void residual_cuda(const void* src, const void* x, size_t n, DType dtype, size_t n_chunks, void* e,
                   int64_t target_chunk, void* stream);

void reduce_chunks_cuda(const void* src, size_t chunk_len, size_t n_records, DType dtype, bool average, void* dst,
                        void* stream);

}  // namespace minmax_uint8
}  // namespace bagua

#endif  // BAGUA_WITH_CUDA
