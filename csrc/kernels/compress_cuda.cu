// CUDA kernels of MinMaxUInt8 compression over the element functions of minmax_uint8.h.
//
// compress: (1) put the initial statistics into each target record's header scratch words,
// (2) grid-stride min/max/non-finite reduction, one block-level reduction per block and chunk
// merged with atomics into the scratch, (3) turn the statistics into the final header,
// (4) encode the codes and zero the padding. All kernels go on the caller's stream; nothing syncs.
#include "kernels/compress_cuda.h"

#include <cuda_runtime.h>

#include <string>

#include "common/error.h"
#include "kernels/compress_cpu.h"
#include "kernels/minmax_uint8.h"

namespace bagua {
namespace minmax_uint8 {
namespace {

constexpr int kThreads = 256;
constexpr int kWarps = kThreads / 32;
constexpr unsigned kMaxGridY = 65535;
constexpr size_t kTargetBlocks = 2048;       // enough to fill any current GPU a few times over
constexpr size_t kMaxSharedDecoders = 2048;  // 32 KiB of shared memory

// The header's reserved words hold the running Stats while compressing.
__device__ __forceinline__ Stats* stats_scratch(uint8_t* record) {
  return reinterpret_cast<Stats*>(record + 2 * sizeof(float));
}

__device__ __forceinline__ Stats warp_reduce(Stats s) {
  for (int offset = 16; offset > 0; offset >>= 1) {
    Stats other{__shfl_down_sync(0xffffffffu, s.min_key, offset), __shfl_down_sync(0xffffffffu, s.max_key, offset),
                __shfl_down_sync(0xffffffffu, s.bad, offset)};
    s = stats_merge(s, other);
  }
  return s;
}

// Result valid in thread 0. Every thread of the block must call it.
__device__ __forceinline__ Stats block_reduce(Stats s) {
  __shared__ Stats warp_stats[kWarps];
  const int lane = threadIdx.x & 31;
  const int warp = threadIdx.x >> 5;
  s = warp_reduce(s);
  if (lane == 0) warp_stats[warp] = s;
  __syncthreads();
  s = threadIdx.x < kWarps ? warp_stats[threadIdx.x] : stats_init();
  if (warp == 0) s = warp_reduce(s);
  __syncthreads();  // warp_stats may be reused by the next call
  return s;
}

__global__ void init_stats_kernel(uint8_t* dst, size_t len, size_t first, size_t n_todo) {
  for (size_t c = blockIdx.x * size_t(blockDim.x) + threadIdx.x; c < n_todo; c += size_t(gridDim.x) * blockDim.x) {
    *stats_scratch(record_ptr(dst, len, first + c)) = stats_init();
  }
}

template <typename T>
__global__ void stats_kernel(const T* x, size_t len, size_t first, size_t n_todo, uint8_t* dst) {
  for (size_t c = blockIdx.y; c < n_todo; c += gridDim.y) {
    const size_t k = first + c;
    const T* xs = x + k * len;
    Stats s = stats_init();
    for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < len; i += size_t(gridDim.x) * blockDim.x)
      stats_add(s, load_f32(xs[i]));
    s = block_reduce(s);
    if (threadIdx.x == 0) {
      Stats* acc = stats_scratch(record_ptr(dst, len, k));
      atomicMin(&acc->min_key, s.min_key);
      atomicMax(&acc->max_key, s.max_key);
      if (s.bad) atomicOr(&acc->bad, s.bad);
    }
  }
}

__global__ void finalize_header_kernel(uint8_t* dst, size_t len, size_t first, size_t n_todo) {
  for (size_t c = blockIdx.x * size_t(blockDim.x) + threadIdx.x; c < n_todo; c += size_t(gridDim.x) * blockDim.x) {
    uint8_t* record = record_ptr(dst, len, first + c);
    const Header h = make_header(*stats_scratch(record));
    *reinterpret_cast<Header*>(record) = h;
  }
}

template <typename T>
__global__ void encode_kernel(const T* x, size_t len, size_t first, size_t n_todo, uint8_t* dst) {
  const size_t padded = record_bytes(len) - kHeaderBytes;
  for (size_t c = blockIdx.y; c < n_todo; c += gridDim.y) {
    const size_t k = first + c;
    uint8_t* record = record_ptr(dst, len, k);
    const Header* h = reinterpret_cast<const Header*>(record);
    const Encoder e = make_encoder(h->min, h->max);
    const T* xs = x + k * len;
    uint8_t* codes = record + kHeaderBytes;
    for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < padded; i += size_t(gridDim.x) * blockDim.x)
      codes[i] = i < len ? encode(load_f32(xs[i]), e) : uint8_t(0);
  }
}

template <typename T>
__global__ void decode_kernel(const uint8_t* src, size_t len, size_t first, size_t n_todo, T* out) {
  for (size_t c = blockIdx.y; c < n_todo; c += gridDim.y) {
    const size_t k = first + c;
    const uint8_t* record = record_ptr(src, len, k);
    const Header* h = reinterpret_cast<const Header*>(record);
    const Decoder d = make_decoder(h->min, h->max);
    const uint8_t* codes = record + kHeaderBytes;
    T* outs = out + k * len;
    for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < len; i += size_t(gridDim.x) * blockDim.x)
      outs[i] = store_f32<T>(decode(codes[i], d));
  }
}

template <typename T>
__global__ void residual_kernel(const uint8_t* src, size_t len, size_t first, size_t n_todo, const T* x, T* e) {
  for (size_t c = blockIdx.y; c < n_todo; c += gridDim.y) {
    const size_t k = first + c;
    const uint8_t* record = record_ptr(src, len, k);
    const Header* h = reinterpret_cast<const Header*>(record);
    const Decoder d = make_decoder(h->min, h->max);
    const uint8_t* codes = record + kHeaderBytes;
    const T* xs = x + k * len;
    T* es = e + k * len;
    for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < len; i += size_t(gridDim.x) * blockDim.x)
      es[i] = residual(xs[i], decode(codes[i], d));
  }
}

__device__ __forceinline__ Decoder record_decoder(const uint8_t* src, size_t len, size_t r) {
  const Header* h = reinterpret_cast<const Header*>(record_ptr(src, len, r));
  return make_decoder(h->min, h->max);
}

// Same summation order as the host: 0.0f, then record 0, 1, ...; then one division.
template <typename T, bool kSharedDecoders>
__global__ void reduce_chunks_kernel(const uint8_t* src, size_t len, size_t n_records, float divisor, T* out) {
  extern __shared__ Decoder shared_decoders[];
  if (kSharedDecoders) {
    for (size_t r = threadIdx.x; r < n_records; r += blockDim.x) shared_decoders[r] = record_decoder(src, len, r);
    __syncthreads();
  }
  const size_t stride = record_bytes(len);
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < len; i += size_t(gridDim.x) * blockDim.x) {
    float acc = 0.0f;
    const uint8_t* code = src + kHeaderBytes + i;
    for (size_t r = 0; r < n_records; ++r, code += stride)
      acc += decode(*code, kSharedDecoders ? shared_decoders[r] : record_decoder(src, len, r));
    out[i] = store_f32<T>(acc / divisor);
  }
}

size_t ceil_div(size_t a, size_t b) { return (a + b - 1) / b; }

dim3 chunk_grid(size_t len, size_t n_todo) {
  const size_t per_chunk = kTargetBlocks / n_todo > 0 ? kTargetBlocks / n_todo : 1;
  size_t bx = ceil_div(len, kThreads);
  bx = bx < per_chunk ? bx : per_chunk;
  bx = bx > 0 ? bx : 1;
  const size_t by = n_todo < kMaxGridY ? n_todo : kMaxGridY;
  return dim3(static_cast<unsigned>(bx), static_cast<unsigned>(by));
}

unsigned flat_blocks(size_t count) {
  const size_t b = ceil_div(count, kThreads);
  return static_cast<unsigned>(b == 0 ? 1 : (b < kTargetBlocks ? b : kTargetBlocks));
}

void check_aligned(const void* p, const char* what) {
  if (reinterpret_cast<uintptr_t>(p) % 4 != 0)
    throw InvalidArgument(std::string("MinMaxUInt8 (CUDA): ") + what + " must be 4-byte aligned");
}

void check_launch(const char* what) {
  const cudaError_t err = cudaGetLastError();
  if (err != cudaSuccess)
    throw Error(std::string("MinMaxUInt8 (CUDA): launching ") + what + " failed: " + cudaGetErrorString(err));
}

}  // namespace

void compress_cuda(const void* src, size_t n, DType dtype, size_t n_chunks, void* dst, int64_t target_chunk,
                   void* stream) {
  check_compress_args(n, dtype, n_chunks, target_chunk);
  check_aligned(src, "src");
  check_aligned(dst, "dst");
  const size_t len = n / n_chunks;
  const size_t first = target_chunk < 0 ? 0 : static_cast<size_t>(target_chunk);
  const size_t n_todo = target_chunk < 0 ? n_chunks : 1;
  cudaStream_t s = static_cast<cudaStream_t>(stream);
  uint8_t* out = static_cast<uint8_t*>(dst);
  dispatch_float_dtype(dtype, [&](auto tag) {
    using T = decltype(tag);
    const T* x = static_cast<const T*>(src);
    const dim3 grid = chunk_grid(len, n_todo);
    init_stats_kernel<<<flat_blocks(n_todo), kThreads, 0, s>>>(out, len, first, n_todo);
    stats_kernel<T><<<grid, kThreads, 0, s>>>(x, len, first, n_todo, out);
    finalize_header_kernel<<<flat_blocks(n_todo), kThreads, 0, s>>>(out, len, first, n_todo);
    const dim3 encode_grid = chunk_grid(record_bytes(len) - kHeaderBytes, n_todo);
    encode_kernel<T><<<encode_grid, kThreads, 0, s>>>(x, len, first, n_todo, out);
  });
  check_launch("compress");
}

void decompress_cuda(const void* src, size_t n, DType dtype, size_t n_chunks, void* dst, int64_t target_chunk,
                     void* stream) {
  check_compress_args(n, dtype, n_chunks, target_chunk);
  check_aligned(src, "src");
  const size_t len = n / n_chunks;
  if (len == 0) return;
  const size_t first = target_chunk < 0 ? 0 : static_cast<size_t>(target_chunk);
  const size_t n_todo = target_chunk < 0 ? n_chunks : 1;
  cudaStream_t s = static_cast<cudaStream_t>(stream);
  dispatch_float_dtype(dtype, [&](auto tag) {
    using T = decltype(tag);
    decode_kernel<T><<<chunk_grid(len, n_todo), kThreads, 0, s>>>(static_cast<const uint8_t*>(src), len, first, n_todo,
                                                                  static_cast<T*>(dst));
  });
  check_launch("decompress");
}

void residual_cuda(const void* src, const void* x, size_t n, DType dtype, size_t n_chunks, void* e,
                   int64_t target_chunk, void* stream) {
  check_compress_args(n, dtype, n_chunks, target_chunk);
  check_aligned(src, "src");
  const size_t len = n / n_chunks;
  if (len == 0) return;
  const size_t first = target_chunk < 0 ? 0 : static_cast<size_t>(target_chunk);
  const size_t n_todo = target_chunk < 0 ? n_chunks : 1;
  cudaStream_t s = static_cast<cudaStream_t>(stream);
  dispatch_float_dtype(dtype, [&](auto tag) {
    using T = decltype(tag);
    residual_kernel<T><<<chunk_grid(len, n_todo), kThreads, 0, s>>>(
        static_cast<const uint8_t*>(src), len, first, n_todo, static_cast<const T*>(x), static_cast<T*>(e));
  });
  check_launch("residual");
}

void reduce_chunks_cuda(const void* src, size_t chunk_len, size_t n_records, DType dtype, bool average, void* dst,
                        void* stream) {
  check_reduce_args(chunk_len, n_records, dtype);
  check_aligned(src, "src");
  if (chunk_len == 0) return;
  cudaStream_t s = static_cast<cudaStream_t>(stream);
  const float divisor = average ? static_cast<float>(n_records) : 1.0f;
  const uint8_t* in = static_cast<const uint8_t*>(src);
  dispatch_float_dtype(dtype, [&](auto tag) {
    using T = decltype(tag);
    T* out = static_cast<T*>(dst);
    const unsigned blocks = flat_blocks(chunk_len);
    if (n_records <= kMaxSharedDecoders) {
      reduce_chunks_kernel<T, true>
          <<<blocks, kThreads, n_records * sizeof(Decoder), s>>>(in, chunk_len, n_records, divisor, out);
    } else {
      reduce_chunks_kernel<T, false><<<blocks, kThreads, 0, s>>>(in, chunk_len, n_records, divisor, out);
    }
  });
  check_launch("reduce_chunks");
}

}  // namespace minmax_uint8
}  // namespace bagua
