#include "ffi/ffi_common.h"

#include <exception>
#include <stdexcept>

#include "comm/registry.h"
#include "common/error.h"

namespace bagua {
namespace ffi {

bool to_engine_dtype(xffi::DataType t, DType* out) {
  switch (t) {
    case xffi::DataType::F32: *out = DType::kFloat32; return true;
    case xffi::DataType::F64: *out = DType::kFloat64; return true;
    case xffi::DataType::F16: *out = DType::kFloat16; return true;
    case xffi::DataType::BF16: *out = DType::kBFloat16; return true;
    case xffi::DataType::S32: *out = DType::kInt32; return true;
    case xffi::DataType::S64: *out = DType::kInt64; return true;
    case xffi::DataType::U8: *out = DType::kUInt8; return true;
    default: return false;
  }
}

CommunicatorPtr communicator_for(int64_t handle, DeviceType device) {
  CommunicatorPtr comm = lookup_communicator(handle);
  if (comm->device_type() != device) {
    const char* want = device == DeviceType::kCPU ? "CPU" : "CUDA";
    const char* have = comm->device_type() == DeviceType::kCPU ? "CPU" : "CUDA";
    throw InvalidArgument(std::string("array is on ") + want + " but " + comm->describe() + " communicates " + have +
                          " memory");
  }
  return comm;
}

xffi::Error error_from_current_exception(const char* what) {
  std::string prefix = std::string("bagua ") + what + ": ";
  try {
    throw;
  } catch (const TimeoutError& e) {
    return xffi::Error(xffi::ErrorCode::kDeadlineExceeded, prefix + "CommTimeoutError: " + e.what());
  } catch (const PeerError& e) {
    return xffi::Error(xffi::ErrorCode::kUnavailable, prefix + "PeerError: " + e.what());
  } catch (const MismatchError& e) {
    return xffi::Error(xffi::ErrorCode::kFailedPrecondition, prefix + "MismatchError: " + e.what());
  } catch (const Error& e) {
    return xffi::Error(xffi::ErrorCode::kInternal, prefix + "BaguaError: " + e.what());
  } catch (const InvalidArgument& e) {
    return xffi::Error(xffi::ErrorCode::kInvalidArgument, prefix + "ValueError: " + e.what());
  } catch (const std::exception& e) {
    return xffi::Error(xffi::ErrorCode::kInternal, prefix + "BaguaError: " + e.what());
  } catch (...) {
    return xffi::Error(xffi::ErrorCode::kUnknown, prefix + "BaguaError: unknown exception");
  }
}

}  // namespace ffi
}  // namespace bagua
