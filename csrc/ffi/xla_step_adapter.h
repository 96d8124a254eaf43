// The XLA FFI adapter of the algorithm steps (ops/registry.h), shared by every
// platform: the same step code the engine runs on torch buckets, run on the
// leaves of one bucket of a jitted JAX program ("bagua_step" target).
//
// Operands: the ordering token, the step number (an int32 or int64 scalar),
// then the bucket's leaves in bucket order (n_data of them, one dtype), then
// the step's state, if it keeps one (Step::num_state() > 0), as either
//   * one block laid out as Step::state_layout() says (by default num_state *
//     padded elements of the data's dtype, span k at element k * padded:
//     low-precision decentralized's replicas; low rank: its own block of its
//     compute dtype), or
//   * n_data leaves shaped like the data (num_state == 1 only; QAdam's
//     momentum, which the optimizer keeps per leaf).
// Results: the token, one result per data leaf (the leaf after the step for
// in-place steps, which the lowering aliases to their operands; the step's
// result for weight steps: the peer average, or the weights themselves when
// the step does not communicate), then the state, updated in place (aliased).
// Attributes: "step" (the registry name), "params" ("key=value;..."), "comm",
// "intra", "inter" (communicator handles; -1 when absent), "n_data".
//
// The leaves' shapes, back to back, are the bucket's layout the step is made
// with (ops/algorithm_step.h: low rank views each leaf as a matrix).
//
// The adapter gathers the leaves into one contiguous bucket of `padded`
// elements (their total rounded up to the step's alignment, the padding
// zeroed: the engine's bucket layout; a state block's spans get their padding
// zeroed too, as the engine's StepOp does), runs the step on it and scatters the
// bucket back into the results. Gathering here, on the step thread, instead of
// concatenating in XLA keeps the copies off XLA's critical path.
//
// A call is checked when XLA calls the handler (prepare_step) and run by
// run_prepared, whose copies, memsets, kernels and collectives go through the
// Platform's ExecContext:
//   * CPU (cpu_handlers.cc): it runs later on the step thread (step_thread.h)
//     and the handler returns an ffi::Future, so XLA computes what does not
//     depend on it (the rest of backward) while the step communicates;
//   * CUDA (cuda_handlers.cc): it runs at once, enqueuing everything on XLA's
//     stream (NCCL on that stream; a staged Gloo communicator waits for it),
//     and the handler returns when the work is enqueued.
// The step number is the platform's business: prepare_step only checks its
// operand; the CPU handler reads it (read_host_step), the CUDA handler keeps a
// host-side count (see cuda_handlers.cc).
#pragma once

#include <cstdint>
#include <string_view>
#include <vector>

#include "ffi/collectives.h"
#include "ops/algorithm_step.h"

namespace bagua {
namespace ffi {

// Memory a step call uses besides its operands: the step's scratch and the
// adapter's gathered buckets (kept apart so their slots never collide), on
// `device` (null: plain host memory). Grow-only: once every slot reached its
// largest size, calls allocate nothing. One caller at a time; work still in
// flight on a stream must be ordered before the next call using it (same
// stream, or the CPU step thread's sequential runs).
struct StepMemory {
  explicit StepMemory(DevicePtr device = nullptr);
  GrowOnlyScratch step;
  GrowOnlyScratch buckets;

 private:
  DevicePtr device_;  // keeps the allocations' Device alive
};

// Everything a step call needs once its buffers are known, by value: XLA's
// call frame is gone when an asynchronous handler's work runs.
struct PreparedStep {
  StepPtr step;
  Platform platform;
  DType dtype = DType::kFloat32;
  size_t padded = 0;           // elements of the gathered bucket
  int64_t number = 0;          // the step number: set by the platform handler
  std::vector<Span> data_in;   // the data leaves
  std::vector<Span> data_out;  // their results (may alias data_in)
  // State as one block: its operand and result (may alias); count 0 if none.
  Span state_block_in, state_block_out;
  // State as leaves mirroring the data; empty if none.
  std::vector<Span> state_in, state_out;
};

// Throws InvalidArgument unless `step` is an int32 or int64 scalar.
void check_step_operand(const xffi::AnyBuffer& step);
// The step number at `data` (host memory) of `type` (S32 or S64); throws
// InvalidArgument when it is negative.
int64_t step_value(const void* data, xffi::DataType type);
// The step operand's value, read from host memory (CPU buffers).
int64_t read_host_step(const xffi::AnyBuffer& step);

// Checks the call and decodes it (number left 0); throws InvalidArgument
// naming the problem.
PreparedStep prepare_step(const Platform& p, std::string_view name, std::string_view params, int64_t comm,
                          int64_t intra, int64_t inter, int64_t n_data, xffi::AnyBuffer step,
                          const xffi::RemainingArgs& args, const xffi::RemainingRets& rets);

// Runs a prepared call with `memory` (on the call's device).
void run_prepared(const PreparedStep& call, StepMemory& memory);

}  // namespace ffi
}  // namespace bagua
