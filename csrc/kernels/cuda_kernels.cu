// CUDA kernels over the element functions shared with the CPU (kernels/*.h).
#include <algorithm>
#include <string>

#include <cuda_runtime.h>

#include "common/error.h"
#include "kernels/cuda_kernels.h"
#include "kernels/scale.h"

namespace bagua {
namespace cuda {
namespace {

constexpr int kThreads = 256;
constexpr size_t kMaxBlocks = 4096;  // grid-stride loops cover the rest

unsigned int blocks_for(size_t count) {
  return static_cast<unsigned int>(std::min((count + kThreads - 1) / kThreads, kMaxBlocks));
}

template <typename T>
__global__ void scale_kernel(T* data, size_t count, typename ScaleMath<T>::Factor factor) {
  const size_t stride = static_cast<size_t>(blockDim.x) * gridDim.x;
  for (size_t i = static_cast<size_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < count; i += stride) {
    data[i] = ScaleMath<T>::scale(data[i], factor);
  }
}

template <typename T>
__global__ void divide_kernel(T* data, size_t count, typename ScaleMath<T>::Divisor divisor) {
  const size_t stride = static_cast<size_t>(blockDim.x) * gridDim.x;
  for (size_t i = static_cast<size_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < count; i += stride) {
    data[i] = ScaleMath<T>::divide(data[i], divisor);
  }
}

void check_args(void* data, size_t count, DType dtype) {
  if (!is_valid_dtype(static_cast<int>(dtype))) {
    throw InvalidArgument("unknown dtype code " + std::to_string(static_cast<int>(dtype)));
  }
  if (count > 0 && data == nullptr) throw InvalidArgument("null buffer with a non-zero count");
}

void check_launch(const char* kernel, DType dtype) {
  cudaError_t err = cudaGetLastError();
  if (err != cudaSuccess) {
    throw Error(std::string("launching the ") + kernel + " kernel (" + dtype_name(dtype) +
                ") failed: " + cudaGetErrorName(err) + ": " + cudaGetErrorString(err));
  }
}

}  // namespace

void launch_scale(void* data, size_t count, DType dtype, double factor, cudaStream_t stream) {
  check_args(data, count, dtype);
  if (count == 0) return;
  visit_dtype(dtype, [&](auto tag) {
    using T = decltype(tag);
    scale_kernel<T><<<blocks_for(count), kThreads, 0, stream>>>(static_cast<T*>(data), count,
                                                                 ScaleMath<T>::factor(factor));
  });
  check_launch("scale", dtype);
}

void launch_divide(void* data, size_t count, DType dtype, double divisor, cudaStream_t stream) {
  check_args(data, count, dtype);
  if (is_integer_dtype(dtype) && !integer_divisor_ok(divisor)) {
    throw InvalidArgument("integer division needs a non-zero whole divisor, got " +
                          std::to_string(divisor));
  }
  if (count == 0) return;
  visit_dtype(dtype, [&](auto tag) {
    using T = decltype(tag);
    divide_kernel<T><<<blocks_for(count), kThreads, 0, stream>>>(static_cast<T*>(data), count,
                                                                  ScaleMath<T>::divisor(divisor));
  });
  check_launch("divide", dtype);
}

}  // namespace cuda
}  // namespace bagua
