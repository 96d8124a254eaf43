#include "ffi/steps.h"

#include <string>

#include "common/error.h"
#include "ops/registry.h"

namespace bagua {
namespace ffi {
namespace {

// Scratch memory of the steps run by this thread.
HostScratch& thread_scratch() {
  thread_local HostScratch scratch;
  return scratch;
}

// The step number lives in host memory on CPU; a CUDA handler must first
// copy it to the host (Platform::copy copies within one device).
int64_t read_step(const Platform& p, const xffi::AnyBuffer& step) {
  if (p.device != DeviceType::kCPU) throw InvalidArgument("algorithm steps run on CPU buffers only in this build");
  if (step.element_count() != 1) throw InvalidArgument("the step number must be a scalar");
  int64_t value = 0;
  if (step.element_type() == xffi::DataType::S32) {
    int32_t v = 0;
    p.copy(&v, step.untyped_data(), sizeof v, p.stream);
    value = v;
  } else if (step.element_type() == xffi::DataType::S64) {
    p.copy(&value, step.untyped_data(), sizeof value, p.stream);
  } else {
    throw InvalidArgument("the step number must be int32 or int64");
  }
  if (value < 0) throw InvalidArgument("the step number must be >= 0, got " + std::to_string(value));
  return value;
}

CommunicatorPtr optional_communicator(int64_t handle, DeviceType device) {
  return handle < 0 ? nullptr : communicator_for(handle, device);
}

}  // namespace

PreparedStep prepare_step(const Platform& p, std::string_view name, std::string_view params, int64_t comm,
                          int64_t intra, int64_t inter, xffi::AnyBuffer data, xffi::AnyBuffer step,
                          xffi::Result<xffi::AnyBuffer> out) {
  CommSet comms{communicator_for(comm, p.device), optional_communicator(intra, p.device),
                optional_communicator(inter, p.device)};
  StepPtr s = make_step(std::string(name), comms, StepParams::parse(std::string(params)));
  DType dtype;
  if (!to_engine_dtype(data.element_type(), &dtype) || data.element_type() != out->element_type())
    throw InvalidArgument(s->describe() + ": unsupported or mismatched element types");
  const size_t count = data.element_count();
  if (out->element_count() != count)
    throw InvalidArgument(s->describe() + ": result has " + std::to_string(out->element_count()) +
                          " elements, data " + std::to_string(count));
  s->check(dtype, count);
  if (s->num_state() > 0)
    throw InvalidArgument(s->describe() + " keeps state: call it through the bagua_step_state target");
  const int64_t number = read_step(p, step);
  const Span in{data.untyped_data(), count, dtype};
  const Span result{out->untyped_data(), count, dtype};
  if (s->has_result()) {
    if (result.data == in.data) throw InvalidArgument(s->describe() + ": the result must not alias the weights");
    return PreparedStep{std::move(s), p, in, result, number};
  }
  if (result.data != in.data) p.copy(result.data, in.data, in.nbytes(), p.stream);
  return PreparedStep{std::move(s), p, result, result, number};
}

PreparedStep prepare_step_with_state(const Platform& p, std::string_view name, std::string_view params,
                                     int64_t comm, int64_t intra, int64_t inter, xffi::AnyBuffer data,
                                     xffi::AnyBuffer step, xffi::AnyBuffer state, xffi::Result<xffi::AnyBuffer> out,
                                     xffi::Result<xffi::AnyBuffer> state_out) {
  CommSet comms{communicator_for(comm, p.device), optional_communicator(intra, p.device),
                optional_communicator(inter, p.device)};
  StepPtr s = make_step(std::string(name), comms, StepParams::parse(std::string(params)));
  const int n_state = s->num_state();
  if (n_state == 0) throw InvalidArgument(s->describe() + " keeps no state: call it through the bagua_step target");
  if (s->has_result()) throw InvalidArgument(s->describe() + ": stateful steps work in place");
  DType dtype;
  if (!to_engine_dtype(data.element_type(), &dtype) || data.element_type() != out->element_type() ||
      state.element_type() != data.element_type() || state_out->element_type() != data.element_type())
    throw InvalidArgument(s->describe() + ": unsupported or mismatched element types");
  const size_t count = data.element_count();
  if (out->element_count() != count)
    throw InvalidArgument(s->describe() + ": result has " + std::to_string(out->element_count()) +
                          " elements, data " + std::to_string(count));
  const size_t state_count = static_cast<size_t>(n_state) * count;
  if (state.element_count() != state_count || state_out->element_count() != state_count)
    throw InvalidArgument(s->describe() + ": the state must hold " + std::to_string(n_state) + " x " +
                          std::to_string(count) + " elements, got " + std::to_string(state.element_count()));
  s->check(dtype, count);
  const int64_t number = read_step(p, step);
  const Span result{out->untyped_data(), count, dtype};
  const size_t state_bytes = state_count * dtype_size(dtype);
  if (result.data != data.untyped_data()) p.copy(result.data, data.untyped_data(), result.nbytes(), p.stream);
  if (state_out->untyped_data() != state.untyped_data())
    p.copy(state_out->untyped_data(), state.untyped_data(), state_bytes, p.stream);
  return PreparedStep{std::move(s), p, result, result, number,
                      state_spans(state_out->untyped_data(), n_state, count, dtype)};
}

void run_prepared(const PreparedStep& call) {
  const Platform& p = call.platform;
  const ExecContext ctx{p.device, p.stream, &thread_scratch()};
  const bool communicated = call.step->run_with_state(ctx, call.data, call.result, call.state, call.number);
  // a weight step that did not communicate hands the weights back unchanged
  if (!communicated && call.result.data != call.data.data)
    p.copy(call.result.data, call.data.data, call.data.nbytes(), p.stream);
}

}  // namespace ffi
}  // namespace bagua
