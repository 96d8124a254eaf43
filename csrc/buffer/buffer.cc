#include "buffer/buffer.h"

#include <cstdlib>
#include <cstring>
#include <string>

#include "common/error.h"

#ifdef BAGUA_WITH_CUDA
#include <cuda_runtime_api.h>
#endif

namespace bagua {
namespace {

size_t count_elements(const std::vector<int64_t>& shape) {
  size_t n = 1;
  for (int64_t d : shape) {
    if (d < 0) throw InvalidArgument("negative dimension " + std::to_string(d) + " in buffer shape");
    n *= static_cast<size_t>(d);
  }
  return n;
}

#ifdef BAGUA_WITH_CUDA
void check_cuda(cudaError_t err, const char* what) {
  if (err != cudaSuccess) {
    cudaGetLastError();  // reset the error so later CUDA calls do not report it again
    throw Error(std::string(what) + " failed: " + cudaGetErrorString(err));
  }
}

// Runs with `device` current and restores the caller's device afterwards.
class DeviceGuard {
 public:
  explicit DeviceGuard(int device) {
    check_cuda(cudaGetDevice(&previous_), "cudaGetDevice");
    if (previous_ != device) check_cuda(cudaSetDevice(device), "cudaSetDevice");
  }
  ~DeviceGuard() { cudaSetDevice(previous_); }

 private:
  int previous_ = 0;
};
#endif

}  // namespace

std::shared_ptr<Storage> Storage::allocate(size_t nbytes, DeviceType device, int device_index, bool zero) {
  std::shared_ptr<Storage> s(new Storage());
  s->nbytes_ = nbytes;
  s->device_type_ = device;
  s->device_index_ = device_index;
  if (device == DeviceType::kCPU) {
    // Never zero bytes: every export needs a valid, aligned address.
    size_t rounded = (nbytes + kHostAlignment - 1) / kHostAlignment * kHostAlignment;
    s->data_ = std::aligned_alloc(kHostAlignment, rounded == 0 ? kHostAlignment : rounded);
    if (s->data_ == nullptr) throw Error("cannot allocate " + std::to_string(nbytes) + " bytes of host memory");
    if (zero) std::memset(s->data_, 0, nbytes);
    return s;
  }
#ifdef BAGUA_WITH_CUDA
  DeviceGuard guard(device_index);
  check_cuda(cudaMalloc(&s->data_, nbytes == 0 ? 1 : nbytes), "cudaMalloc");
  if (zero) check_cuda(cudaMemset(s->data_, 0, nbytes), "cudaMemset");
  return s;
#else
  throw Error("cannot allocate CUDA memory: bagua_core was built without CUDA");
#endif
}

Storage::~Storage() {
  if (data_ == nullptr) return;
  if (device_type_ == DeviceType::kCPU) {
    std::free(data_);
    return;
  }
#ifdef BAGUA_WITH_CUDA
  cudaFree(data_);  // errors here (driver shutting down) cannot be reported
#endif
}

Buffer::Buffer(std::vector<int64_t> shape, DType dtype, DeviceType device, int device_index, bool zero)
    : shape_(std::move(shape)), dtype_(dtype) {
  numel_ = count_elements(shape_);
  storage_ = Storage::allocate(numel_ * dtype_size(dtype_), device, device_index, zero);
}

Buffer::Buffer(std::shared_ptr<Storage> storage, std::vector<int64_t> shape, DType dtype)
    : storage_(std::move(storage)), shape_(std::move(shape)), dtype_(dtype) {
  numel_ = count_elements(shape_);
}

Buffer Buffer::view(DType dtype) const {
  if (dtype_size(dtype) == dtype_size(dtype_)) return Buffer(storage_, shape_, dtype);
  size_t bytes = nbytes();
  if (bytes % dtype_size(dtype) != 0) {
    throw InvalidArgument("cannot view " + std::to_string(bytes) + " bytes as " + dtype_name(dtype));
  }
  return Buffer(storage_, {static_cast<int64_t>(bytes / dtype_size(dtype))}, dtype);
}

void copy_bytes(void* dst, const void* src, size_t nbytes, DeviceType device) {
  if (nbytes == 0 || dst == src) return;
  if (device == DeviceType::kCPU) {
    std::memmove(dst, src, nbytes);
    return;
  }
#ifdef BAGUA_WITH_CUDA
  check_cuda(cudaMemcpy(dst, src, nbytes, cudaMemcpyDeviceToDevice), "cudaMemcpy");
#else
  throw Error("cannot copy CUDA memory: bagua_core was built without CUDA");
#endif
}

}  // namespace bagua
