// Bodies of the collective FFI handlers, shared by every platform.
//
// A platform handler (cpu_handlers.cc now; a CUDA one beside it later) decodes
// its buffers, token and attributes, then calls these with a Platform that says
// which device the buffers live on, which stream to enqueue on (null on CPU),
// and how to copy device memory. The communicator must live on the same device.
//
// Outputs may alias inputs (the lowering sets input_output_aliases {0: 0} when
// asked), so every body works in place when in == out.
#pragma once

#include <cstddef>
#include <cstdint>

#include "comm/communicator.h"
#include "ffi/ffi_common.h"

namespace bagua {
namespace ffi {

struct Platform {
  DeviceType device;
  Stream stream;  // cudaStream_t of XLA on CUDA, null on CPU
  void (*copy)(void* dst, const void* src, size_t bytes, Stream stream);
};

// out = op over all ranks of in (same shape and dtype).
xffi::Error allreduce(const Platform& p, int64_t comm, int64_t op, xffi::AnyBuffer in,
                      xffi::Result<xffi::AnyBuffer> out);

// out = in of rank `root` (same shape and dtype).
xffi::Error broadcast(const Platform& p, int64_t comm, int64_t root, xffi::AnyBuffer in,
                      xffi::Result<xffi::AnyBuffer> out);

// out = stack of every rank's in, rank-major: out has size() * in elements.
xffi::Error allgather(const Platform& p, int64_t comm, xffi::AnyBuffer in,
                      xffi::Result<xffi::AnyBuffer> out);

}  // namespace ffi
}  // namespace bagua
