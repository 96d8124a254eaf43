// Bodies of the collective FFI handlers, shared by every platform.
//
// A platform handler (cpu_handlers.cc, cuda_handlers.cc) decodes its buffers,
// token and attributes, then calls these with a Platform that says which device
// the buffers live on and which stream to enqueue on. The communicator must
// live on the same device; it gets the Platform's stream (NCCL enqueues on it,
// a staged Gloo communicator waits for it first: comm/staged_communicator.h).
//
// Outputs may alias inputs (the lowering sets input_output_aliases {0: 0} when
// asked), so every body works in place when in == out.
#pragma once

#include <cstddef>
#include <cstdint>

#include "comm/communicator.h"
#include "device/device.h"
#include "ffi/ffi_common.h"
#include "ops/algorithm_step.h"

namespace bagua {
namespace ffi {

// Where a handler's buffers live and its work goes. The only thing in which
// the CPU and CUDA handlers differ: every copy, memset and element kernel of
// the shared bodies goes through context() (ops/kernels.h), so on CPU it runs
// at once on host memory and on CUDA it is enqueued on XLA's stream.
struct Platform {
  DeviceType device = DeviceType::kCPU;
  Stream stream = nullptr;  // XLA's cudaStream_t on CUDA; null on CPU
  Device* dev = nullptr;    // the CUDA Device of that stream; null on CPU (plain host memory)

  ExecContext context(Scratch* scratch = nullptr) const { return ExecContext{device, stream, scratch, dev}; }
};

// out = op over all ranks of in (same shape and dtype).
xffi::Error allreduce(const Platform& p, int64_t comm, int64_t op, xffi::AnyBuffer in,
                      xffi::Result<xffi::AnyBuffer> out);

// out = in of rank `root` (same shape and dtype).
xffi::Error broadcast(const Platform& p, int64_t comm, int64_t root, xffi::AnyBuffer in,
                      xffi::Result<xffi::AnyBuffer> out);

// out = stack of every rank's in, rank-major: out has size() * in elements.
xffi::Error allgather(const Platform& p, int64_t comm, xffi::AnyBuffer in, xffi::Result<xffi::AnyBuffer> out);

}  // namespace ffi
}  // namespace bagua
