#include "comm/nccl/cuda_util.h"

#include "common/error.h"

namespace bagua {
namespace cuda {

std::string error_text(cudaError_t err) { return std::string(cudaGetErrorName(err)) + ": " + cudaGetErrorString(err); }

void check(cudaError_t err, const std::string& what) {
  if (err != cudaSuccess) throw Error(what + " failed: " + error_text(err));
}

int device_count() {
  int count = 0;  // left unwritten when the call fails
  cudaError_t err = cudaGetDeviceCount(&count);
  if (err == cudaErrorInsufficientDriver || err == cudaErrorNoDevice) {
    cudaGetLastError();  // do not leave the error for the next caller
    return 0;
  }
  check(err, "cudaGetDeviceCount");
  return count;
}

int driver_version() {
  int version = 0;
  if (cudaDriverGetVersion(&version) != cudaSuccess) return 0;
  return version;
}

int runtime_version() { return CUDART_VERSION; }

namespace {
std::string version_text(int v) { return std::to_string(v / 1000) + "." + std::to_string((v % 1000) / 10); }
}  // namespace

std::string no_device_reason() {
  const int driver = driver_version();
  if (driver == 0) return "no CUDA driver is installed";
  if (driver < runtime_version()) {
    return "the CUDA driver supports CUDA " + version_text(driver) + " but Bagua was built with CUDA " +
           version_text(runtime_version()) + " (update the driver or rebuild Bagua with an older toolkit)";
  }
  return "no CUDA device is visible (check CUDA_VISIBLE_DEVICES)";
}

DeviceGuard::DeviceGuard(int device) {
  check(cudaGetDevice(&previous_), "cudaGetDevice");
  if (previous_ != device) {
    check(cudaSetDevice(device), "cudaSetDevice(" + std::to_string(device) + ")");
  } else {
    previous_ = -1;
  }
}

DeviceGuard::~DeviceGuard() {
  if (previous_ >= 0) cudaSetDevice(previous_);
}

}  // namespace cuda
}  // namespace bagua
