// CPU handlers: buffers are host memory, the communicator is Gloo.
#include <chrono>
#include <cstring>
#include <functional>
#include <memory>
#include <string>
#include <utility>

#include "ffi/async_step.h"
#include "ffi/collectives.h"
#include "ffi/handlers.h"
#include "ffi/leader_broadcast.h"
#include "ffi/step_thread.h"
#include "ffi/step_timings.h"
#include "ffi/xla_step_adapter.h"

namespace bagua {
namespace ffi {
namespace {

const Platform kCpu{DeviceType::kCPU, nullptr, nullptr};

// The step thread's memory (only that thread runs steps; freed when it exits).
StepMemory& step_memory() {
  thread_local StepMemory memory;
  return memory;
}

xffi::Error allreduce_cpu(xffi::AnyBuffer in, xffi::Token, xffi::Result<xffi::AnyBuffer> out, xffi::Result<xffi::Token>,
                          int64_t comm, int64_t op) {
  return allreduce(kCpu, comm, op, in, out);
}

xffi::Error broadcast_cpu(xffi::AnyBuffer in, xffi::Token, xffi::Result<xffi::AnyBuffer> out, xffi::Result<xffi::Token>,
                          int64_t comm, int64_t root) {
  return broadcast(kCpu, comm, root, in, out);
}

xffi::Error allgather_cpu(xffi::AnyBuffer in, xffi::Token, xffi::Result<xffi::AnyBuffer> out, xffi::Result<xffi::Token>,
                          int64_t comm) {
  return allgather(kCpu, comm, in, out);
}

// A failed step of XLA run `run`, as its future reports it; the run's leader
// broadcasts (ffi/leader_broadcast.h) fail with it rather than wait.
xffi::Future failed(xffi::RunId run, xffi::Error error) {
  leader_broadcast_run_failed(run.run_id, error.message());
  xffi::Promise promise;
  xffi::Future future(promise);
  promise.SetError(std::move(error));
  return future;
}

// Runs `work` on the step thread (ffi/step_thread.h), completing the returned
// future with its outcome, so XLA goes on with independent work meanwhile.
xffi::Future on_step_thread(xffi::RunId run, std::string what, std::function<void()> work) {
  xffi::Promise promise;
  xffi::Future future(promise);
  run_on_step_thread([run, promise, what = std::move(what), work = std::move(work)]() mutable {
    xffi::Error done = guarded(what.c_str(), work);
    if (done.failure()) {
      leader_broadcast_run_failed(run.run_id, done.message());
      promise.SetError(std::move(done));
    } else {
      promise.SetAvailable();
    }
  });
  return future;
}

// Checks a step call at once (`prepare` returns its PreparedStep), then runs
// it on the step thread. While BAGUA_TRACE records (ffi/step_timings.h), the
// call's times are recorded under `model`/`bucket`.
template <typename Prepare>
xffi::Future run_async(xffi::RunId run, std::string_view name, std::string_view model, int64_t bucket,
                       Prepare&& prepare) {
  const std::string what = "step " + std::string(name);
  std::shared_ptr<PreparedStep> call;
  std::shared_ptr<StepTimingRecord> timing;
  if (step_timings_on()) {
    timing = std::make_shared<StepTimingRecord>();
    timing->timing.ready_ns = monotonic_ns();
    timing->model = std::string(model);
    timing->bucket = bucket;
  }
  xffi::Error checked = guarded(what.c_str(), [&] { call = std::make_shared<PreparedStep>(prepare()); });
  if (checked.failure()) return failed(run, std::move(checked));
  if (timing) {
    timing->step = call->number;
    timing->timing.launch_ns = monotonic_ns();
  }
  return on_step_thread(run, what, [call, timing] {
    if (timing) timing->timing.start_ns = monotonic_ns();
    struct Record {  // records the times however the step ends
      const std::shared_ptr<StepTimingRecord>& timing;
      ~Record() {
        if (!timing) return;
        timing->timing.end_ns = monotonic_ns();
        record_step_timing(std::move(*timing));
      }
    } record{timing};
    run_prepared(*call, step_memory());
  });
}

// One bucket of an algorithm step (ffi/xla_step_adapter.h): token, step number, then the
// leaves (and state) as remaining operands and results.
xffi::Future step_cpu(xffi::RunId run, xffi::Token, xffi::AnyBuffer step, xffi::RemainingArgs args,
                      xffi::Result<xffi::Token>, xffi::RemainingRets rets, std::string_view name,
                      std::string_view params, int64_t comm, int64_t intra, int64_t inter, int64_t n_data,
                      std::string_view model, int64_t bucket) {
  return run_async(run, name, model, bucket, [&] {
    PreparedStep call = prepare_step(kCpu, name, params, comm, intra, inter, n_data, step, args, rets);
    call.number = read_host_step(step);  // host memory, final when XLA calls the handler
    return call;
  });
}

// Asynchronous model average's training step (ffi/async_step.h).
xffi::Future async_step_cpu(xffi::RunId run, xffi::Token, xffi::AnyBuffer step, xffi::RemainingArgs args,
                            xffi::Result<xffi::Token>, xffi::RemainingRets rets, int64_t weights) {
  const char* what = "asynchronous model average";
  auto call = std::make_shared<AsyncStepCall>();
  int64_t number = 0;
  xffi::Error checked = guarded(what, [&] {
    *call = prepare_async_step(weights, args, rets);
    number = read_host_step(step);
  });
  if (checked.failure()) return failed(run, std::move(checked));
  return on_step_thread(run, what,
                        [call, number] { call->weights->step(number, call->params, call->updates, call->out); });
}

// The leader device's arrays copied into the process's other devices
// (ffi/leader_broadcast.h); the results alias the operands.
xffi::Error leader_broadcast_cpu(xffi::RunId run, xffi::AnyBuffer position, xffi::RemainingArgs args,
                                 xffi::RemainingRets rets, int64_t site, int64_t participants, int64_t timeout_ms) {
  return guarded("leader broadcast", [&] {
    if (position.element_type() != xffi::DataType::S32 || position.element_count() != 1)
      throw InvalidArgument("leader broadcast: the position must be an int32 scalar");
    if (args.size() != rets.size())
      throw InvalidArgument("leader broadcast: " + std::to_string(args.size()) + " operands for " +
                            std::to_string(rets.size()) + " results");
    std::vector<ByteSpan> arrays;
    for (size_t i = 0; i < rets.size(); ++i) {
      auto in = args.get<xffi::AnyBuffer>(i);
      auto out = rets.get<xffi::AnyBuffer>(i);
      if (!in || !out) throw InvalidArgument("leader broadcast: argument " + std::to_string(i) + " is not a buffer");
      if (in->untyped_data() != (*out)->untyped_data())  // XLA may not honour the alias
        std::memcpy((*out)->untyped_data(), in->untyped_data(), in->size_bytes());
      arrays.push_back(ByteSpan{(*out)->untyped_data(), (*out)->size_bytes()});
    }
    leader_broadcast(run.run_id, site, *position.typed_data<int32_t>(), participants,
                     std::chrono::milliseconds(timeout_ms), arrays);
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

XLA_FFI_DEFINE_HANDLER_SYMBOL(
    bagua_ffi_allgather_cpu, bagua::ffi::allgather_cpu,
    xffi::Ffi::Bind().Arg<xffi::AnyBuffer>().Arg<xffi::Token>().Ret<xffi::AnyBuffer>().Ret<xffi::Token>().Attr<int64_t>(
        "comm"));

XLA_FFI_DEFINE_HANDLER_SYMBOL(bagua_ffi_step_cpu, bagua::ffi::step_cpu,
                              xffi::Ffi::Bind()
                                  .Ctx<xffi::RunId>()
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

XLA_FFI_DEFINE_HANDLER_SYMBOL(bagua_ffi_async_step_cpu, bagua::ffi::async_step_cpu,
                              xffi::Ffi::Bind()
                                  .Ctx<xffi::RunId>()
                                  .Arg<xffi::Token>()
                                  .Arg<xffi::AnyBuffer>()
                                  .RemainingArgs()
                                  .Ret<xffi::Token>()
                                  .RemainingRets()
                                  .Attr<int64_t>("weights"));

XLA_FFI_DEFINE_HANDLER_SYMBOL(bagua_ffi_leader_broadcast_cpu, bagua::ffi::leader_broadcast_cpu,
                              xffi::Ffi::Bind()
                                  .Ctx<xffi::RunId>()
                                  .Arg<xffi::AnyBuffer>()
                                  .RemainingArgs()
                                  .RemainingRets()
                                  .Attr<int64_t>("site")
                                  .Attr<int64_t>("participants")
                                  .Attr<int64_t>("timeout_ms"));
