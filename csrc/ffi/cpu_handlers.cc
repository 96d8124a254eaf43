// CPU handlers: buffers are host memory, the communicator is Gloo.
#include <cstring>
#include <memory>
#include <string>

#include "ffi/collectives.h"
#include "ffi/handlers.h"
#include "ffi/step_thread.h"
#include "ffi/steps.h"

namespace bagua {
namespace ffi {
namespace {

void host_copy(void* dst, const void* src, size_t bytes, Stream) { std::memcpy(dst, src, bytes); }

const Platform kCpu{DeviceType::kCPU, nullptr, host_copy};

xffi::Error allreduce_cpu(xffi::AnyBuffer in, xffi::Token, xffi::Result<xffi::AnyBuffer> out,
                          xffi::Result<xffi::Token>, int64_t comm, int64_t op) {
  return allreduce(kCpu, comm, op, in, out);
}

xffi::Error broadcast_cpu(xffi::AnyBuffer in, xffi::Token, xffi::Result<xffi::AnyBuffer> out,
                          xffi::Result<xffi::Token>, int64_t comm, int64_t root) {
  return broadcast(kCpu, comm, root, in, out);
}

xffi::Error allgather_cpu(xffi::AnyBuffer in, xffi::Token, xffi::Result<xffi::AnyBuffer> out,
                          xffi::Result<xffi::Token>, int64_t comm) {
  return allgather(kCpu, comm, in, out);
}

// Checks a step call at once (`prepare` returns its PreparedStep), then runs
// it on the step thread (ffi/step_thread.h), completing the returned future,
// so XLA goes on with independent work meanwhile.
template <typename Prepare>
xffi::Future run_async(std::string_view name, Prepare&& prepare) {
  xffi::Promise promise;
  xffi::Future future(promise);
  const std::string what = "step " + std::string(name);
  std::shared_ptr<PreparedStep> call;
  xffi::Error checked = guarded(what.c_str(), [&] { call = std::make_shared<PreparedStep>(prepare()); });
  if (checked.failure()) {
    promise.SetError(std::move(checked));
    return future;
  }
  run_on_step_thread([call, promise, what]() mutable {
    xffi::Error done = guarded(what.c_str(), [&] { run_prepared(*call); });
    if (done.failure()) {
      promise.SetError(std::move(done));
    } else {
      promise.SetAvailable();
    }
  });
  return future;
}

xffi::Future step_cpu(xffi::AnyBuffer data, xffi::AnyBuffer step, xffi::Token, xffi::Result<xffi::AnyBuffer> out,
                      xffi::Result<xffi::Token>, std::string_view name, std::string_view params, int64_t comm,
                      int64_t intra, int64_t inter) {
  return run_async(name, [&] { return prepare_step(kCpu, name, params, comm, intra, inter, data, step, out); });
}

// As step_cpu, for steps with state (ffi/steps.h).
xffi::Future step_state_cpu(xffi::AnyBuffer data, xffi::AnyBuffer step, xffi::AnyBuffer state, xffi::Token,
                            xffi::Result<xffi::AnyBuffer> out, xffi::Result<xffi::AnyBuffer> state_out,
                            xffi::Result<xffi::Token>, std::string_view name, std::string_view params, int64_t comm,
                            int64_t intra, int64_t inter) {
  return run_async(name, [&] {
    return prepare_step_with_state(kCpu, name, params, comm, intra, inter, data, step, state, out, state_out);
  });
}

}  // namespace
}  // namespace ffi
}  // namespace bagua

namespace xffi = ::xla::ffi;

XLA_FFI_DEFINE_HANDLER_SYMBOL(bagua_ffi_allreduce_cpu, bagua::ffi::allreduce_cpu,
                              xffi::Ffi::Bind()
                                  .Arg<xffi::AnyBuffer>()
                                  .Arg<xffi::Token>()
                                  .Ret<xffi::AnyBuffer>()
                                  .Ret<xffi::Token>()
                                  .Attr<int64_t>("comm")
                                  .Attr<int64_t>("op"));

XLA_FFI_DEFINE_HANDLER_SYMBOL(bagua_ffi_broadcast_cpu, bagua::ffi::broadcast_cpu,
                              xffi::Ffi::Bind()
                                  .Arg<xffi::AnyBuffer>()
                                  .Arg<xffi::Token>()
                                  .Ret<xffi::AnyBuffer>()
                                  .Ret<xffi::Token>()
                                  .Attr<int64_t>("comm")
                                  .Attr<int64_t>("root"));

XLA_FFI_DEFINE_HANDLER_SYMBOL(bagua_ffi_allgather_cpu, bagua::ffi::allgather_cpu,
                              xffi::Ffi::Bind()
                                  .Arg<xffi::AnyBuffer>()
                                  .Arg<xffi::Token>()
                                  .Ret<xffi::AnyBuffer>()
                                  .Ret<xffi::Token>()
                                  .Attr<int64_t>("comm"));

XLA_FFI_DEFINE_HANDLER_SYMBOL(bagua_ffi_step_cpu, bagua::ffi::step_cpu,
                              xffi::Ffi::Bind()
                                  .Arg<xffi::AnyBuffer>()
                                  .Arg<xffi::AnyBuffer>()
                                  .Arg<xffi::Token>()
                                  .Ret<xffi::AnyBuffer>()
                                  .Ret<xffi::Token>()
                                  .Attr<std::string_view>("step")
                                  .Attr<std::string_view>("params")
                                  .Attr<int64_t>("comm")
                                  .Attr<int64_t>("intra")
                                  .Attr<int64_t>("inter"));

XLA_FFI_DEFINE_HANDLER_SYMBOL(bagua_ffi_step_state_cpu, bagua::ffi::step_state_cpu,
                              xffi::Ffi::Bind()
                                  .Arg<xffi::AnyBuffer>()
                                  .Arg<xffi::AnyBuffer>()
                                  .Arg<xffi::AnyBuffer>()
                                  .Arg<xffi::Token>()
                                  .Ret<xffi::AnyBuffer>()
                                  .Ret<xffi::AnyBuffer>()
                                  .Ret<xffi::Token>()
                                  .Attr<std::string_view>("step")
                                  .Attr<std::string_view>("params")
                                  .Attr<int64_t>("comm")
                                  .Attr<int64_t>("intra")
                                  .Attr<int64_t>("inter"));
