// The low-bit block codecs on device memory (layout and math: kernels/lowbit.h), same arguments and
// same results as the host versions in kernels/lowbit_cpu.h. One thread codes one block, running
// lowbit.h's block functions, so the bytes and values are the host's. Declared only in builds with
// CUDA (BAGUA_WITH_CUDA). Launchers enqueue on `stream` (a cudaStream_t) and return without
// synchronising, except count_nonfinite_cuda, which returns a count. Argument errors raise
// InvalidArgument; launch failures raise bagua::Error.
#pragma once

#ifdef BAGUA_WITH_CUDA

#include <cstddef>
#include <cstdint>

#include "common/dtype.h"
#include "kernels/lowbit.h"

namespace bagua {
namespace lowbit {

void compress_cuda(Spec spec, const void* src, size_t n, DType dtype, size_t n_chunks, void* dst, int64_t target_chunk,
                   void* stream);
void decompress_cuda(Spec spec, const void* src, size_t n, DType dtype, size_t n_chunks, void* dst,
                     int64_t target_chunk, void* stream);
void residual_cuda(Spec spec, const void* src, const void* x, size_t n, DType dtype, size_t n_chunks, void* e,
                   int64_t target_chunk, void* stream);
void reduce_chunks_cuda(Spec spec, const void* src, size_t chunk_len, size_t n_records, DType dtype, bool average,
                        void* dst, void* stream);
// Counts x's non-finite elements with `counter` (8 bytes of device memory) and waits for the stream.
size_t count_nonfinite_cuda(const void* x, size_t n, DType dtype, void* counter, void* stream);

}  // namespace lowbit
}  // namespace bagua

#endif  // BAGUA_WITH_CUDA
