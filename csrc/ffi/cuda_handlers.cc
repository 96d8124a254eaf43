// CUDA handlers: buffers are device memory of the device of XLA's stream
// (xffi::PlatformStream<cudaStream_t>), and every handler enqueues its work on
// that stream before it returns; XLA orders what follows after it. The bodies
// are the CPU handlers' (collectives.h, xla_step_adapter.h): only the Platform differs.
//
// The group's communicator must be a CUDA one (communicator_for checks it):
// NCCL enqueues on the stream; a Gloo group serving CUDA memory is a staged
// communicator (comm/staged_communicator.h), which first waits for the stream
// (the operands are final only then), runs Gloo on pinned host copies and
// copies the results back on the stream.
//
// Algorithm steps run synchronously in the handler (no step thread, no
// ffi::Future: the work is on the stream once enqueued) with memory kept per
// stream (ffi/xla_step_adapter.h StepMemory on the stream's Device, grow-only, so a warm
// step allocates nothing; every call on one stream reuses it in stream order).
// BAGUA_TRACE records no step timings here: the handler's own times would be
// those of enqueuing, not of the work. The handlers declare no traits, so XLA
// never captures them into a command buffer (CUDA graph): it calls them on
// every execution, which their host-side logic (the step count below, a
// staged group's wait) needs.
//
// Compiled only in builds with both CUDA and the XLA FFI headers
// (CMakeLists.txt defines BAGUA_WITH_XLA_FFI_CUDA for them).
#include <cuda_runtime_api.h>

#include <chrono>
#include <cstdint>
#include <initializer_list>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "comm/nccl/cuda_util.h"
#include "comm/registry.h"
#include "common/error.h"
#include "device/device.h"
#include "ffi/async_step.h"
#include "ffi/collectives.h"
#include "ffi/handlers.h"
#include "ffi/xla_step_adapter.h"

namespace bagua {
namespace ffi {
namespace {

// The device whose stream XLA passed.
int device_of(cudaStream_t stream) {
  int device = 0;
#if CUDART_VERSION >= 12080
  cuda::check(cudaStreamGetDevice(stream, &device), "cudaStreamGetDevice (XLA's stream)");
#else
  cuda::check(cudaGetDevice(&device), "cudaGetDevice");
#endif
  return device;
}

// How the step number reaches the host.
//
// The step number is an operand in device memory (BaguaState.step, or the
// optimizer's count), but the host needs it when the handler runs: it decides
// what the step enqueues (whether a decentralized step communicates this
// time, QAdam's warm-up or compressed phase). Reading it there would mean
// synchronizing XLA's stream, i.e. waiting for everything XLA enqueued before
// the step (the backward pass the step should overlap with) on every call.
// So each (model, bucket) of a stream keeps a host-side count instead:
//   * its first call reads the device value once (a copy into pinned memory
//     and a stream synchronize: one stall per bucket and process) and seeds
//     the count; later calls use the count + 1 and read nothing;
//   * each call (while no check is pending) also copies the device value into
//     the pinned slot and records an event on the stream; a later call
//     queries that event without waiting and, once it completed, compares the
//     value with the number the host used. On a mismatch (a state restored
//     from a checkpoint in the same process, the transform's update applied
//     twice in one training step) the next call reads the device value again
//     synchronously and counts on from it. The calls in between used the old
//     count on every rank alike (every rank counts the same calls), so the
//     ranks still agree; only their schedule followed the old count.
class StepCounter {
 public:
  StepCounter(Device& device, int index) : pinned_(device.allocate_pinned(sizeof(int64_t))) {
    cuda::DeviceGuard guard(index);
    cuda::check(cudaEventCreateWithFlags(&event_, cudaEventDisableTiming), "cudaEventCreate");
  }
  ~StepCounter() { cudaEventDestroy(event_); }
  StepCounter(const StepCounter&) = delete;
  StepCounter& operator=(const StepCounter&) = delete;

  // The number of this call of the step whose number operand is `step`.
  int64_t next(Device& device, cudaStream_t stream, const xffi::AnyBuffer& step, std::chrono::milliseconds timeout) {
    check_step_operand(step);
    const size_t nbytes = step.element_type() == xffi::DataType::S32 ? sizeof(int32_t) : sizeof(int64_t);
    bool reseed = !seeded_;
    if (pending_) {
      const cudaError_t done = cudaEventQuery(event_);
      if (done == cudaSuccess) {
        pending_ = false;
        if (step_value(pinned_.get(), pending_type_) != pending_number_) reseed = true;
      } else if (done != cudaErrorNotReady) {
        cuda::check(done, "checking the step number (cudaEventQuery)");
      }
    }
    if (reseed) {
      device.copy_async(pinned_.get(), step.untyped_data(), nbytes, stream);
      device.synchronize(stream, timeout);
      next_ = step_value(pinned_.get(), step.element_type());
      seeded_ = true;
      pending_ = false;
    }
    const int64_t number = next_++;
    if (!pending_) {
      device.copy_async(pinned_.get(), step.untyped_data(), nbytes, stream);
      cuda::check(cudaEventRecord(event_, stream), "cudaEventRecord");
      pending_ = true;
      pending_number_ = number;
      pending_type_ = step.element_type();
    }
    return number;
  }

 private:
  std::shared_ptr<void> pinned_;  // the device's step number, copied on the stream
  cudaEvent_t event_ = nullptr;   // recorded after that copy
  bool seeded_ = false;
  int64_t next_ = 0;
  bool pending_ = false;  // a copy whose value is not compared yet
  int64_t pending_number_ = 0;
  xffi::DataType pending_type_ = xffi::DataType::S32;
};

// What the handlers keep per XLA stream.
struct StreamState {
  StreamState(int index, cudaStream_t stream)
      : index(index), device(cuda_device(index)), platform{DeviceType::kCUDA, stream, device.get()}, memory(device) {}

  const int index;
  const DevicePtr device;
  const Platform platform;
  std::mutex mu;  // one step call at a time
  StepMemory memory;
  std::map<std::pair<std::string, int64_t>, std::unique_ptr<StepCounter>> counters;  // by (model, bucket)

  StepCounter& counter(std::string_view model, int64_t bucket) {
    auto& c = counters[{std::string(model), bucket}];
    if (!c) c = std::make_unique<StepCounter>(*device, index);
    return *c;
  }
};

StreamState& state_of(cudaStream_t stream) {
  const int index = device_of(stream);
  static std::mutex mu;
  // Never destroyed: at exit the CUDA runtime may be gone already, and XLA
  // may still hold the streams.
  static auto* states = new std::map<std::pair<int, cudaStream_t>, std::unique_ptr<StreamState>>();
  std::lock_guard<std::mutex> lock(mu);
  auto& s = (*states)[{index, stream}];
  if (!s) s = std::make_unique<StreamState>(index, stream);
  return *s;
}

// A device communicator (NCCL) runs its kernels on the GPU it was made for
// (the process's LOCAL_RANK-th); XLA's stream must be on that GPU, or they
// would work on another device's memory. Host communicators (staged Gloo)
// say -1 and serve any device. Handles < 0: no communicator.
void check_same_device(std::initializer_list<int64_t> handles, int index, const char* what) {
  for (const int64_t handle : handles) {
    if (handle < 0) continue;
    const int want = lookup_communicator(handle)->device_index();
    if (want >= 0 && want != index)
      throw InvalidArgument(std::string(what) + ": the array is on cuda:" + std::to_string(index) +
                            " but the group's communicator is on cuda:" + std::to_string(want) +
                            "; pin each process's JAX to its own GPU (jax.distributed.initialize() under "
                            "bagua-run, or CUDA_VISIBLE_DEVICES per process)");
  }
}

// Runs body(platform, state) for XLA's stream with its device current, once
// the communicators `handles` are known to serve that device.
template <typename Body>
xffi::Error on_stream(cudaStream_t stream, const char* what, std::initializer_list<int64_t> handles, Body&& body) {
  StreamState* state = nullptr;
  std::unique_ptr<cuda::DeviceGuard> guard;
  xffi::Error found = guarded(what, [&] {
    state = &state_of(stream);
    check_same_device(handles, state->index, what);
    guard = std::make_unique<cuda::DeviceGuard>(state->index);
  });
  if (found.failure()) return found;
  return body(*state);
}

xffi::Error allreduce_cuda(cudaStream_t stream, xffi::AnyBuffer in, xffi::Token, xffi::Result<xffi::AnyBuffer> out,
                           xffi::Result<xffi::Token>, int64_t comm, int64_t op) {
  return on_stream(stream, "allreduce", {comm},
                   [&](StreamState& s) { return allreduce(s.platform, comm, op, in, out); });
}

xffi::Error broadcast_cuda(cudaStream_t stream, xffi::AnyBuffer in, xffi::Token, xffi::Result<xffi::AnyBuffer> out,
                           xffi::Result<xffi::Token>, int64_t comm, int64_t root) {
  return on_stream(stream, "broadcast", {comm},
                   [&](StreamState& s) { return broadcast(s.platform, comm, root, in, out); });
}

xffi::Error allgather_cuda(cudaStream_t stream, xffi::AnyBuffer in, xffi::Token, xffi::Result<xffi::AnyBuffer> out,
                           xffi::Result<xffi::Token>, int64_t comm) {
  return on_stream(stream, "allgather", {comm}, [&](StreamState& s) { return allgather(s.platform, comm, in, out); });
}

// One bucket of an algorithm step (ffi/xla_step_adapter.h), enqueued on XLA's stream.
xffi::Error step_cuda(cudaStream_t stream, xffi::Token, xffi::AnyBuffer step, xffi::RemainingArgs args,
                      xffi::Result<xffi::Token>, xffi::RemainingRets rets, std::string_view name,
                      std::string_view params, int64_t comm, int64_t intra, int64_t inter, int64_t n_data,
                      std::string_view model, int64_t bucket) {
  const std::string what = "step " + std::string(name);
  return on_stream(stream, what.c_str(), {comm, intra, inter}, [&](StreamState& s) {
    return guarded(what.c_str(), [&] {
      std::lock_guard<std::mutex> lock(s.mu);
      PreparedStep call = prepare_step(s.platform, name, params, comm, intra, inter, n_data, step, args, rets);
      const std::chrono::milliseconds timeout = communicator_for(comm, DeviceType::kCUDA)->timeout();
      call.number = s.counter(model, bucket).next(*s.device, stream, step, timeout);
      run_prepared(call, s.memory);
    });
  });
}

// Asynchronous model average's training step (ffi/async_step.h): through host
// copies, since the weights it changes are host memory.
xffi::Error async_step_cuda(cudaStream_t stream, xffi::Token, xffi::AnyBuffer step, xffi::RemainingArgs args,
                            xffi::Result<xffi::Token>, xffi::RemainingRets rets, int64_t weights) {
  const char* what = "asynchronous model average";
  return on_stream(stream, what, {}, [&](StreamState& s) {
    return guarded(what, [&] {
      std::lock_guard<std::mutex> lock(s.mu);
      AsyncStepCall call = prepare_async_step(weights, args, rets);
      check_step_operand(step);
      const std::chrono::milliseconds timeout = call.weights->averager()->timeout();
      std::vector<std::vector<unsigned char>> host;  // the operands' host copies; the updates' become the results
      auto to_host = [&](std::vector<Span>& spans) {
        for (Span& x : spans) {
          host.emplace_back(x.nbytes());
          s.device->copy_async(host.back().data(), x.data, x.nbytes(), stream);
          x.data = host.back().data();
        }
      };
      host.reserve(2 * call.params.size() + 1);
      host.emplace_back(sizeof(int64_t));
      void* number = host.back().data();
      s.device->copy_async(number, step.untyped_data(), step.element_type() == xffi::DataType::S32 ? 4 : 8, stream);
      to_host(call.params);
      to_host(call.updates);
      s.device->synchronize(stream, timeout);
      std::vector<Span> out = call.updates;  // in place on the host copies
      call.weights->step(step_value(number, step.element_type()), call.params, call.updates, out);
      for (size_t i = 0; i < out.size(); ++i)
        s.device->copy_async(call.out[i].data, out[i].data, out[i].nbytes(), stream);
      s.device->synchronize(stream, timeout);
    });
  });
}

}  // namespace
}  // namespace ffi
}  // namespace bagua

namespace xffi = ::xla::ffi;

XLA_FFI_DEFINE_HANDLER_SYMBOL(bagua_ffi_allreduce_cuda, bagua::ffi::allreduce_cuda,
                              xffi::Ffi::Bind()
                                  .Ctx<xffi::PlatformStream<cudaStream_t>>()
                                  .Arg<xffi::AnyBuffer>()
                                  .Arg<xffi::Token>()
                                  .Ret<xffi::AnyBuffer>()
                                  .Ret<xffi::Token>()
                                  .Attr<int64_t>("comm")
                                  .Attr<int64_t>("op"));

XLA_FFI_DEFINE_HANDLER_SYMBOL(bagua_ffi_broadcast_cuda, bagua::ffi::broadcast_cuda,
                              xffi::Ffi::Bind()
                                  .Ctx<xffi::PlatformStream<cudaStream_t>>()
                                  .Arg<xffi::AnyBuffer>()
                                  .Arg<xffi::Token>()
                                  .Ret<xffi::AnyBuffer>()
                                  .Ret<xffi::Token>()
                                  .Attr<int64_t>("comm")
                                  .Attr<int64_t>("root"));

XLA_FFI_DEFINE_HANDLER_SYMBOL(bagua_ffi_allgather_cuda, bagua::ffi::allgather_cuda,
                              xffi::Ffi::Bind()
                                  .Ctx<xffi::PlatformStream<cudaStream_t>>()
                                  .Arg<xffi::AnyBuffer>()
                                  .Arg<xffi::Token>()
                                  .Ret<xffi::AnyBuffer>()
                                  .Ret<xffi::Token>()
                                  .Attr<int64_t>("comm"));

XLA_FFI_DEFINE_HANDLER_SYMBOL(bagua_ffi_step_cuda, bagua::ffi::step_cuda,
                              xffi::Ffi::Bind()
                                  .Ctx<xffi::PlatformStream<cudaStream_t>>()
                                  .Arg<xffi::Token>()
                                  .Arg<xffi::AnyBuffer>()
                                  .RemainingArgs()
                                  .Ret<xffi::Token>()
                                  .RemainingRets()
                                  .Attr<std::string_view>("step")
                                  .Attr<std::string_view>("params")
                                  .Attr<int64_t>("comm")
                                  .Attr<int64_t>("intra")
                                  .Attr<int64_t>("inter")
                                  .Attr<int64_t>("n_data")
                                  .Attr<std::string_view>("model")
                                  .Attr<int64_t>("bucket"));

XLA_FFI_DEFINE_HANDLER_SYMBOL(bagua_ffi_async_step_cuda, bagua::ffi::async_step_cuda,
                              xffi::Ffi::Bind()
                                  .Ctx<xffi::PlatformStream<cudaStream_t>>()
                                  .Arg<xffi::Token>()
                                  .Arg<xffi::AnyBuffer>()
                                  .RemainingArgs()
                                  .Ret<xffi::Token>()
                                  .RemainingRets()
                                  .Attr<int64_t>("weights"));
