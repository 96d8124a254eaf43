// The XLA FFI adapter of the algorithm steps (ops/registry.h), shared by every
// platform: the same step code the engine runs on torch buckets, run on XLA
// buffers inside a jitted JAX program.
//
// Operands: data (the bucket: gradients or weights) and the step number (an
// int32 or int64 scalar); result: the data after the step (in-place steps; the
// lowering aliases it to the operand) or the step's result (weight steps: the
// peer average; the weights themselves when the step does not communicate).
// Attributes: "step" (the registry name), "params" ("key=value;..."), "comm",
// "intra", "inter" (communicator handles; -1 when absent).
//
// Stateful steps (Step::num_state() > 0) go through the "bagua_step_state"
// target: one more operand, the state block (num_state * count elements of
// the data's dtype, span k at element k * count), aliased to one more result
// that the step updates in place.
//
// A call is checked when XLA calls the handler (prepare_step) and may run
// later (run_prepared) on another thread: the CPU handler runs it on the
// step thread (step_thread.h) and returns an ffi::Future, so XLA computes
// what does not depend on it (the rest of backward) meanwhile.
#pragma once

#include <cstdint>
#include <string_view>
#include <vector>

#include "ffi/collectives.h"
#include "ops/step.h"

namespace bagua {
namespace ffi {

// Everything a step call needs once its buffers are known, by value: XLA's
// call frame is gone when an asynchronous handler's work runs.
struct PreparedStep {
  StepPtr step;
  Platform platform;
  Span data;
  Span result;  // == data for in-place steps (the result was copied in first)
  int64_t number = 0;
  std::vector<Span> state;  // the state result's spans (the state operand was copied in first)
};

// Checks the call and decodes it; throws InvalidArgument naming the problem.
PreparedStep prepare_step(const Platform& p, std::string_view name, std::string_view params, int64_t comm,
                          int64_t intra, int64_t inter, xffi::AnyBuffer data, xffi::AnyBuffer step,
                          xffi::Result<xffi::AnyBuffer> out);

// prepare_step for the "bagua_step_state" target: also the state operand and result.
PreparedStep prepare_step_with_state(const Platform& p, std::string_view name, std::string_view params,
                                     int64_t comm, int64_t intra, int64_t inter, xffi::AnyBuffer data,
                                     xffi::AnyBuffer step, xffi::AnyBuffer state, xffi::Result<xffi::AnyBuffer> out,
                                     xffi::Result<xffi::AnyBuffer> state_out);

// Runs a prepared call with this thread's scratch memory.
void run_prepared(const PreparedStep& call);

}  // namespace ffi
}  // namespace bagua
