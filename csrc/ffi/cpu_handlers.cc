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

// One bucket of an algorithm step (ffi/steps.h): token, step number, then the
// leaves (and state) as remaining operands and results.
xffi::Future step_cpu(xffi::Token, xffi::AnyBuffer step, xffi::RemainingArgs args, xffi::Result<xffi::Token>,
                      xffi::RemainingRets rets, std::string_view name, std::string_view params, int64_t comm,
                      int64_t intra, int64_t inter, int64_t n_data) {
  return run_async(name, [&] {
    return prepare_step(kCpu, name, params, comm, intra, inter, n_data, step, args, rets);
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
                                  .Attr<int64_t>("n_data"));
