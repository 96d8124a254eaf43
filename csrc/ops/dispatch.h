// How a step kernel runs on the context's device: the one dispatch of
// ops/kernels.cc and ops/low_rank_kernels.cc (private to them).
//
//   on_device(ctx, "what", host_loop, BAGUA_CUDA_LAUNCH(cuda::launch_x(..., stream)));
//
// * CPU, plain host (ctx.dev null): host_loop() runs now, on the caller's thread.
// * CPU on a Device (the host implementation, device/device.h): host_loop is
//   enqueued on ctx.stream, so it runs in stream order like a CUDA launch. It
//   may run after on_device returns: capture by value.
// * CUDA: the launch runs now with the context's stream, named `stream` inside
//   BAGUA_CUDA_LAUNCH (a cudaStream_t). Builds without CUDA do not compile the
//   launch and throw InvalidArgument naming "what" instead.
#pragma once

#include <string>
#include <utility>

#include "common/error.h"
#include "ops/algorithm_step.h"

#ifdef BAGUA_WITH_CUDA
#include <cuda_runtime_api.h>
#define BAGUA_CUDA_LAUNCH(...) [&](cudaStream_t stream) { __VA_ARGS__; }
#else
#define BAGUA_CUDA_LAUNCH(...) \
  ::bagua::step_kernels::NoCudaLaunch {}
#endif

namespace bagua {
namespace step_kernels {

struct NoCudaLaunch {};

template <typename HostLoop, typename Launch>
void on_device(const ExecContext& ctx, const char* what, HostLoop&& host_loop, Launch&& launch) {
  if (ctx.device == DeviceType::kCPU) {
    if (ctx.dev == nullptr) return host_loop();
    return ctx.dev->enqueue_host(ctx.stream, std::forward<HostLoop>(host_loop));
  }
#ifdef BAGUA_WITH_CUDA
  (void)what;
  launch(static_cast<cudaStream_t>(ctx.stream));
#else
  (void)launch;
  throw InvalidArgument(std::string(what) + ": this build has no CUDA support");
#endif
}

}  // namespace step_kernels
}  // namespace bagua
