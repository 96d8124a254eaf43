// CUDA kernels of the low-bit block codecs: one thread per block record, over lowbit.h's block
// functions (its float32 block buffers live in the thread's local memory).
#include "kernels/lowbit_cuda.h"

#include <cuda_runtime.h>

#include <cmath>
#include <string>
#include <type_traits>

#include "common/error.h"
#include "kernels/compress_cpu.h"
#include "kernels/lowbit_cpu.h"

namespace bagua {
namespace lowbit {
namespace {

constexpr int kThreads = 128;

unsigned grid_for(size_t threads) { return static_cast<unsigned>((threads + kThreads - 1) / kThreads); }

void check_launch(const char* what) {
  const cudaError_t err = cudaGetLastError();
  if (err != cudaSuccess)
    throw Error(std::string("low-bit codec (CUDA): launching ") + what + " failed: " + cudaGetErrorString(err));
}

__device__ uint8_t* block_at(void* base, Spec s, size_t len, size_t k, size_t j) {
  return static_cast<uint8_t*>(base) + k * record_bytes(s, len) + j * block_bytes(s);
}
__device__ const uint8_t* block_at(const void* base, Spec s, size_t len, size_t k, size_t j) {
  return static_cast<const uint8_t*>(base) + k * record_bytes(s, len) + j * block_bytes(s);
}

// Thread t codes block t % nb of chunk first + t / nb; the thread of a chunk's last block also zeroes
// the record's padding.
template <typename T>
__global__ void compress_kernel(Spec s, const T* x, size_t len, size_t first, size_t todo, uint8_t* dst) {
  const size_t nb = n_blocks(s, len);
  const size_t t = blockIdx.x * size_t(blockDim.x) + threadIdx.x;
  if (t >= todo * nb) return;
  const size_t k = first + t / nb, j = t % nb, off = j * block_len(s);
  const size_t bl = len - off < block_len(s) ? len - off : block_len(s);
  float buf[kMaxBlock];
  for (size_t i = 0; i < bl; ++i) buf[i] = load_f32(x[k * len + off + i]);
  encode_block(s, buf, bl, block_at(dst, s, len, k, j));
  if (j == nb - 1) {
    uint8_t* rec = dst + k * record_bytes(s, len);
    for (size_t b = nb * block_bytes(s); b < record_bytes(s, len); ++b) rec[b] = 0u;
  }
}

// mode 0: decompress into out; 1: residual of x into out.
template <typename T>
__global__ void decode_kernel(Spec s, const uint8_t* src, size_t len, size_t first, size_t todo, const T* x, T* out,
                              int mode) {
  const size_t nb = n_blocks(s, len);
  const size_t t = blockIdx.x * size_t(blockDim.x) + threadIdx.x;
  if (t >= todo * nb) return;
  const size_t k = first + t / nb, j = t % nb, off = j * block_len(s);
  const size_t bl = len - off < block_len(s) ? len - off : block_len(s);
  float buf[kMaxBlock];
  decode_block(s, block_at(src, s, len, k, j), bl, buf);
  const size_t at = k * len + off;
  for (size_t i = 0; i < bl; ++i) out[at + i] = mode == 0 ? store_f32<T>(buf[i]) : residual(x[at + i], buf[i]);
}

template <typename T>
__global__ void reduce_kernel(Spec s, const uint8_t* src, size_t len, size_t n_records, bool average, T* out) {
  const size_t nb = n_blocks(s, len);
  const size_t j = blockIdx.x * size_t(blockDim.x) + threadIdx.x;
  if (j >= nb) return;
  const size_t off = j * block_len(s);
  const size_t bl = len - off < block_len(s) ? len - off : block_len(s);
  float buf[kMaxBlock];
  float acc[kMaxBlock];
  for (size_t i = 0; i < bl; ++i) acc[i] = 0.0f;
  for (size_t r = 0; r < n_records; ++r) {
    decode_block(s, block_at(src, s, len, r, j), bl, buf);
    for (size_t i = 0; i < bl; ++i) acc[i] += buf[i];
  }
  const float divisor = static_cast<float>(n_records);
  for (size_t i = 0; i < bl; ++i) out[off + i] = store_f32<T>(average ? acc[i] / divisor : acc[i]);
}

template <typename T>
__global__ void count_kernel(const T* x, size_t n, unsigned long long* counter) {
  unsigned long long bad = 0;
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n; i += size_t(gridDim.x) * blockDim.x) {
    if constexpr (std::is_same_v<T, double>)
      bad += !isfinite(x[i]);
    else
      bad += non_finite(load_f32(x[i]));
  }
  if (bad) atomicAdd(counter, bad);
}

void chunk_range(size_t n_chunks, int64_t target_chunk, size_t* first, size_t* todo) {
  *first = target_chunk < 0 ? 0 : static_cast<size_t>(target_chunk);
  *todo = target_chunk < 0 ? n_chunks : 1;
}

}  // namespace

void compress_cuda(Spec s, const void* src, size_t n, DType dtype, size_t n_chunks, void* dst, int64_t target_chunk,
                   void* stream) {
  check_compress_args(s, n, dtype, n_chunks, target_chunk);
  const size_t len = n / n_chunks;
  size_t first, todo;
  chunk_range(n_chunks, target_chunk, &first, &todo);
  const size_t threads = todo * n_blocks(s, len);
  if (threads == 0) return;
  minmax_uint8::dispatch_float_dtype(dtype, [&](auto tag) {
    using T = decltype(tag);
    compress_kernel<T><<<grid_for(threads), kThreads, 0, static_cast<cudaStream_t>(stream)>>>(
        s, static_cast<const T*>(src), len, first, todo, static_cast<uint8_t*>(dst));
  });
  check_launch("compress");
}

void decompress_cuda(Spec s, const void* src, size_t n, DType dtype, size_t n_chunks, void* dst, int64_t target_chunk,
                     void* stream) {
  check_compress_args(s, n, dtype, n_chunks, target_chunk);
  const size_t len = n / n_chunks;
  size_t first, todo;
  chunk_range(n_chunks, target_chunk, &first, &todo);
  const size_t threads = todo * n_blocks(s, len);
  if (threads == 0) return;
  minmax_uint8::dispatch_float_dtype(dtype, [&](auto tag) {
    using T = decltype(tag);
    decode_kernel<T><<<grid_for(threads), kThreads, 0, static_cast<cudaStream_t>(stream)>>>(
        s, static_cast<const uint8_t*>(src), len, first, todo, nullptr, static_cast<T*>(dst), 0);
  });
  check_launch("decompress");
}

void residual_cuda(Spec s, const void* src, const void* x, size_t n, DType dtype, size_t n_chunks, void* e,
                   int64_t target_chunk, void* stream) {
  check_compress_args(s, n, dtype, n_chunks, target_chunk);
  const size_t len = n / n_chunks;
  size_t first, todo;
  chunk_range(n_chunks, target_chunk, &first, &todo);
  const size_t threads = todo * n_blocks(s, len);
  if (threads == 0) return;
  minmax_uint8::dispatch_float_dtype(dtype, [&](auto tag) {
    using T = decltype(tag);
    decode_kernel<T><<<grid_for(threads), kThreads, 0, static_cast<cudaStream_t>(stream)>>>(
        s, static_cast<const uint8_t*>(src), len, first, todo, static_cast<const T*>(x), static_cast<T*>(e), 1);
  });
  check_launch("residual");
}

void reduce_chunks_cuda(Spec s, const void* src, size_t chunk_len, size_t n_records, DType dtype, bool average,
                        void* dst, void* stream) {
  check_spec(s);
  minmax_uint8::check_reduce_args(chunk_len, n_records, dtype);
  const size_t threads = n_blocks(s, chunk_len);
  if (threads == 0) return;
  minmax_uint8::dispatch_float_dtype(dtype, [&](auto tag) {
    using T = decltype(tag);
    reduce_kernel<T><<<grid_for(threads), kThreads, 0, static_cast<cudaStream_t>(stream)>>>(
        s, static_cast<const uint8_t*>(src), chunk_len, n_records, average, static_cast<T*>(dst));
  });
  check_launch("reduce");
}

size_t count_nonfinite_cuda(const void* x, size_t n, DType dtype, void* counter, void* stream) {
  auto st = static_cast<cudaStream_t>(stream);
  unsigned long long host = 0;
  if (cudaMemsetAsync(counter, 0, sizeof host, st) != cudaSuccess) check_launch("count_nonfinite (memset)");
  if (n > 0) {
    minmax_uint8::dispatch_float_dtype(dtype, [&](auto tag) {
      using T = decltype(tag);
      const unsigned grid = grid_for(n) < 1024u ? grid_for(n) : 1024u;
      count_kernel<T>
          <<<grid, kThreads, 0, st>>>(static_cast<const T*>(x), n, static_cast<unsigned long long*>(counter));
    });
    check_launch("count_nonfinite");
  }
  cudaMemcpyAsync(&host, counter, sizeof host, cudaMemcpyDeviceToHost, st);
  const cudaError_t err = cudaStreamSynchronize(st);
  if (err != cudaSuccess)
    throw Error(std::string("counting non-finite values (CUDA) failed: ") + cudaGetErrorString(err));
  return static_cast<size_t>(host);
}

}  // namespace lowbit
}  // namespace bagua
