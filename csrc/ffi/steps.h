// The XLA FFI adapter of the algorithm steps (ops/registry.h), shared by every
// platform: the same step code the engine runs on torch buckets, run on the
// leaves of one bucket of a jitted JAX program ("bagua_step" target).
//
// Operands: the ordering token, the step number (an int32 or int64 scalar),
// then the bucket's leaves in bucket order (n_data of them, one dtype), then
// the step's state, if it keeps one (Step::num_state() > 0), as either
//   * one block of num_state * padded elements (span k at element k * padded;
//     low-precision decentralized's replicas), or
//   * n_data leaves shaped like the data (num_state == 1 only; QAdam's
//     momentum, which the optimizer keeps per leaf).
// Results: the token, one result per data leaf (the leaf after the step for
// in-place steps, which the lowering aliases to their operands; the step's
// result for weight steps: the peer average, or the weights themselves when
// the step does not communicate), then the state, updated in place (aliased).
// Attributes: "step" (the registry name), "params" ("key=value;..."), "comm",
// "intra", "inter" (communicator handles; -1 when absent), "n_data".
//
// The adapter gathers the leaves into one contiguous bucket of `padded`
// elements (their total rounded up to the step's alignment, the padding
// zeroed: the engine's bucket layout), runs the step on it and scatters the
// bucket back into the results. Gathering here, on the step thread, instead of
// concatenating in XLA keeps the copies off XLA's critical path.
//
// A call is checked when XLA calls the handler (prepare_step) and runs later
// (run_prepared) on another thread: the CPU handler runs it on the step thread
// (step_thread.h) and returns an ffi::Future, so XLA computes what does not
// depend on it (the rest of backward) while the step communicates.
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
  DType dtype = DType::kFloat32;
  size_t padded = 0;  // elements of the gathered bucket
  int64_t number = 0;
  std::vector<Span> data_in;   // the data leaves
  std::vector<Span> data_out;  // their results (may alias data_in)
  // State as one block: its operand and result (may alias); count 0 if none.
  Span state_block_in, state_block_out;
  // State as leaves mirroring the data; empty if none.
  std::vector<Span> state_in, state_out;
};

// Checks the call and decodes it; throws InvalidArgument naming the problem.
PreparedStep prepare_step(const Platform& p, std::string_view name, std::string_view params, int64_t comm,
                          int64_t intra, int64_t inter, int64_t n_data, xffi::AnyBuffer step,
                          const xffi::RemainingArgs& args, const xffi::RemainingRets& rets);

// Runs a prepared call with this thread's scratch memory.
void run_prepared(const PreparedStep& call);

}  // namespace ffi
}  // namespace bagua
