// The XLA FFI adapter of asynchronous model average's training step
// (sched/async_weights.h): target "bagua_async_step", the same on every
// platform.
//
// Operands: the ordering token, the step number (an int32 or int64 scalar),
// then the n leaves of the weights the optimizer stepped from (params), then
// the n leaves of its updates. Results: the token, then the n updates the
// step returns (aliased to the updates' operands). Attribute "weights": an
// AsyncWeights handle (register_async_weights).
//
//   * CPU (cpu_handlers.cc): the step runs on the step thread (ffi/step_thread.h)
//     behind an ffi::Future, in order with the algorithm steps issued before
//     it; it may wait there for the weight lock while a round applies.
//   * CUDA (cuda_handlers.cc): the weights are host memory, so the handler
//     copies the step number, params and updates to the host, waits for XLA's
//     stream, runs the step and copies the results back (waiting again: the
//     host copies are the call's own). Once per training step, after the
//     optimizer: there is nothing left in the step for the wait to stall.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "ffi/ffi_common.h"
#include "sched/async_weights.h"

namespace bagua {
namespace ffi {

struct AsyncStepCall {
  std::shared_ptr<AsyncWeights> weights;
  std::vector<Span> params, updates, out;  // the operands and results, as the platform gave them
};

// Looks the handle up and checks the operands against the weights' leaves.
// Throws InvalidArgument.
AsyncStepCall prepare_async_step(int64_t handle, const xffi::RemainingArgs& args, const xffi::RemainingRets& rets);

}  // namespace ffi
}  // namespace bagua
