// The weights a JAX program trains with while an AsyncAverager
// (sched/async_averager.h) averages them, and the training step that changes
// them. The weights are slots of the averager's host buckets, one per leaf of
// the weights' pytree. bagua_jax's AsyncModelAverage update runs step() once
// per training step, eagerly or inside jax.jit (the "bagua_async_step" FFI
// target, ffi/async_step.h); torch needs none: its parameters are views of the
// buckets, changed in place by its optimizer under the weight lock.
//
// step(number, params, updates, out), host memory, leaf by leaf (each of the
// leaf's dtype and element count; `out` may alias `updates`):
//   * number < warmup_steps: `updates` are the ranks' averaged updates (the
//     frontend ran GradientAllReduce first); the weights become params +
//     updates and out = updates;
//   * afterwards: the first such step starts the loop; then, under the weight
//     lock, out = (w + updates) - params and w = params + out, where w are the
//     weights as the loop averaged them since the last step (ops/elementwise.h
//     AsyncStepMath), so optax.apply_updates(params, out) gives exactly w.
// Once a step started the loop, the frontend aborts and restarts it
// (AsyncAverager::abort / start); steps never start it again. A failure of the
// loop is raised by the next step (AsyncAverager::lock_weights).
//
// Handles (register_async_weights) name an AsyncWeights in a jitted program;
// a frontend that binds new weights to the same algorithm rebinds its handle
// (rebind_async_weights), so programs traced before reach the new ones.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <vector>

#include "bucket/bucket.h"
#include "ops/algorithm_step.h"
#include "sched/async_averager.h"

namespace bagua {

class AsyncWeights {
 public:
  struct Leaf {
    BucketPtr bucket;  // one of the averager's buckets, in host memory
    size_t slot;       // the leaf's slot in it
  };
  // Throws InvalidArgument for no leaves, a bucket on a device, a slot out of
  // range, or a negative warmup_steps.
  AsyncWeights(std::shared_ptr<AsyncAverager> averager, std::vector<Leaf> leaves, int64_t warmup_steps);

  size_t num_leaves() const { return leaves_.size(); }
  // The weights' leaf i in its bucket.
  Span leaf(size_t i) const;
  // See above. Throws InvalidArgument when the spans do not match the leaves.
  void step(int64_t number, const std::vector<Span>& params, const std::vector<Span>& updates,
            const std::vector<Span>& out);
  // Whether a step started the loop.
  bool started() const { return started_; }
  const std::shared_ptr<AsyncAverager>& averager() const { return averager_; }

 private:
  void check(const std::vector<Span>& spans, const char* what) const;

  std::shared_ptr<AsyncAverager> averager_;
  std::vector<Leaf> leaves_;
  int64_t warmup_steps_;
  std::atomic<bool> started_{false};
};

// `weights` may be null: a handle reserved for a later rebind (until then a
// step naming it fails with InvalidArgument).
int64_t register_async_weights(std::shared_ptr<AsyncWeights> weights);
// Throws InvalidArgument for a handle register_async_weights never gave.
void rebind_async_weights(int64_t handle, std::shared_ptr<AsyncWeights> weights);
// Throws InvalidArgument for an unknown handle or one bound to nothing.
std::shared_ptr<AsyncWeights> lookup_async_weights(int64_t handle);
void unregister_async_weights(int64_t handle);

}  // namespace bagua
