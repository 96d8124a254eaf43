// Shared pieces of the XLA FFI handlers: dtype mapping, communicator lookup,
// and the translation of engine exceptions into ffi::Error.
//
// Handlers for every platform (CPU, and CUDA in CUDA builds) call the same collective
// bodies in collectives.h; a platform only decides which stream to pass.
#pragma once

#include <cstdint>
#include <string>

#include "comm/communicator.h"
#include "common/dtype.h"
#include "xla/ffi/api/ffi.h"

namespace bagua {
namespace ffi {

namespace xffi = ::xla::ffi;

// Maps an XLA element type to the engine's; false when the engine lacks it.
bool to_engine_dtype(xffi::DataType t, DType* out);

// The communicator behind `handle`, checked to live on `device`.
// Throws bagua::InvalidArgument (unknown handle, wrong device).
CommunicatorPtr communicator_for(int64_t handle, DeviceType device);

// The exception being handled as an ffi::Error: the code follows the engine's
// class (TimeoutError -> DEADLINE_EXCEEDED, PeerError -> UNAVAILABLE,
// MismatchError -> FAILED_PRECONDITION, InvalidArgument -> INVALID_ARGUMENT,
// others -> INTERNAL) and the message names it: "bagua allreduce: PeerError: ...".
xffi::Error error_from_current_exception(const char* what);

// Runs `body`, turning any exception into an ffi::Error, which XLA surfaces in
// Python as a runtime error raised by the jitted call (never a crash).
template <typename Body>
xffi::Error guarded(const char* what, Body&& body) {
  try {
    body();
    return xffi::Error::Success();
  } catch (...) {
    return error_from_current_exception(what);
  }
}

}  // namespace ffi
}  // namespace bagua
