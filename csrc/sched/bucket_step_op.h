// The engine's adapter from a bucket to a registered step (ops/algorithm_step.h).
//
// It keeps what the step itself may not: the step counter (one execution per
// training step), the result buffer of weight algorithms (the peer average,
// same layout as the bucket), the step's state (one block laid out as
// Step::state_layout() says: by default num_state() spans of the bucket's
// layout, initialised at bind with the bucket's data or zeros, as
// Step::state_init() says; a step's own block starts as zeros) and
// the scratch memory reused across steps. The
// frontend reads the result with copy_back() after the engine's wait().
//
// On a device bucket everything is allocated on the bucket's Device at bind
// (result, state, and scratch the first steps grow): a step allocates
// nothing once warm, and its memsets, copies and element math are enqueued
// on the lane's comm stream.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>

#include "ops/algorithm_step.h"
#include "sched/op.h"

namespace bagua {

class StepOp : public Op {
 public:
  explicit StepOp(StepPtr step);
  std::string describe() const override { return step_->describe(); }
  // Checks dtype and size; allocates the result buffer (a copy of the bucket)
  // and the state. On a device the copies run on `stream` and bind waits for them.
  void bind(const BucketPtr& bucket, Stream stream) override;
  void execute(Bucket& bucket) override;
  bool predict_calls(const Communicator& comm, std::vector<OpDesc>* calls) const override;

  const StepPtr& step_impl() const { return step_; }
  // Executions so far (training steps seen); settable to restore a checkpoint.
  int64_t step() const { return counter_.load(); }
  void set_step(int64_t step);
  // Whether the next execution communicates.
  bool communicates_next() const { return step_->communicates(counter_.load()); }
  // Whether the last execution communicated.
  bool last_communicated() const { return last_communicated_.load(); }

  bool has_result() const { return step_->has_result(); }
  // The result buffer (bucket layout); null for in-place steps.
  const std::shared_ptr<void>& result_memory() const { return result_; }
  // Number of state spans; the state block (laid out as state_layout();
  // null when stateless). Read or write it only between steps (after the
  // engine's wait()).
  int num_state() const { return step_->num_state(); }
  const StateLayout& state_layout() const { return state_layout_; }
  const std::shared_ptr<void>& state_memory() const { return state_; }
  const BucketPtr& bucket() const { return bucket_; }

  // bucket <- result, if the step has a result and the last execution
  // communicated. Call only after the engine's wait(); throws Error while the
  // op runs. Returns whether it copied. On a device the copy is enqueued on
  // `on` (the framework's stream, which wait() ordered after the comm
  // stream); without one it runs on the comm stream and copy_back waits.
  bool copy_back(std::optional<Stream> on = std::nullopt);

 private:
  StepPtr step_;
  BucketPtr bucket_;
  std::shared_ptr<void> result_;
  std::shared_ptr<void> state_;
  StateLayout state_layout_;
  ExecContext context(Bucket& bucket);

  Stream stream_ = nullptr;
  GrowOnlyScratch scratch_;
  std::atomic<int64_t> counter_{0};
  std::atomic<bool> last_communicated_{false};
  std::atomic<bool> running_{false};
};

}  // namespace bagua
