// Small helpers around the CUDA runtime: error checks that throw bagua::Error,
// device discovery that tolerates hosts without a GPU or driver, and a guard
// that restores the caller's current device.
#pragma once

#include <string>

#include <cuda_runtime_api.h>

namespace bagua {
namespace cuda {

// Number of visible CUDA devices; 0 when there is no driver or no device
// (cudaErrorInsufficientDriver / cudaErrorNoDevice). Other errors throw.
int device_count();
// Version of the installed driver (e.g. 13000), 0 when there is none.
int driver_version();
// Version of the CUDA runtime this module was built with (CUDART_VERSION).
int runtime_version();
// Why device_count() is 0, in words: no driver, a driver too old for the
// runtime, or no device.
std::string no_device_reason();

// Throws bagua::Error "<what>: <CUDA error name>: <description>" unless ok.
void check(cudaError_t err, const std::string& what);
std::string error_text(cudaError_t err);

// Makes `device` current for the guard's lifetime.
class DeviceGuard {
 public:
  explicit DeviceGuard(int device);
  ~DeviceGuard();
  DeviceGuard(const DeviceGuard&) = delete;
  DeviceGuard& operator=(const DeviceGuard&) = delete;

 private:
  int previous_ = -1;
};

}  // namespace cuda
}  // namespace bagua
