#include "sched/step_op.h"

#include <cstring>

#include "bucket/host_memory.h"
#include "common/error.h"

namespace bagua {

StepOp::StepOp(StepPtr step) : step_(std::move(step)) {
  if (!step_) throw InvalidArgument("StepOp: no step");
}

void StepOp::set_step(int64_t step) {
  if (step < 0) throw InvalidArgument(describe() + ": step must be >= 0");
  counter_.store(step);
}

void StepOp::bind(const BucketPtr& bucket) {
  if (bucket_) throw InvalidArgument(describe() + " is already part of another bucket's chain");
  try {
    step_->check(bucket->dtype(), bucket->numel());
  } catch (const InvalidArgument& e) {
    throw InvalidArgument(std::string(e.what()) + " [" + bucket->describe() +
                          "; create the bucket with alignment = the group size where the step needs it]");
  }
  if (step_->has_result()) {
    result_ = allocate_host_memory(bucket->nbytes());
    std::memcpy(result_.get(), bucket->data(), bucket->nbytes());
  }
  const int n_state = step_->num_state();
  if (n_state > 0) {
    state_ = allocate_host_memory(n_state * bucket->nbytes());
    for (int k = 0; k < n_state; ++k)
      std::memcpy(static_cast<char*>(state_.get()) + k * bucket->nbytes(), bucket->data(), bucket->nbytes());
  }
  bucket_ = bucket;
}

void StepOp::execute(Bucket& bucket) {
  struct Running {
    std::atomic<bool>& flag;
    explicit Running(std::atomic<bool>& f) : flag(f) { flag.store(true); }
    ~Running() { flag.store(false); }
  } running(running_);

  const int64_t step = counter_.fetch_add(1);
  last_communicated_.store(false);
  // Padding enters compressed chunks (min/max): zero it every step, as a
  // frontend padding a fresh buffer does, so both compute the same numbers.
  const size_t padding = (bucket.numel() - bucket.payload_numel()) * dtype_size(bucket.dtype());
  if (padding) std::memset(static_cast<char*>(bucket.data()) + bucket.nbytes() - padding, 0, padding);
  const Span data{bucket.data(), bucket.numel(), bucket.dtype()};
  const Span result = result_ ? Span{result_.get(), bucket.numel(), bucket.dtype()} : data;
  const ExecContext ctx{DeviceType::kCPU, nullptr, &scratch_};
  const std::vector<Span> state = state_spans(state_.get(), step_->num_state(), bucket.numel(), bucket.dtype());
  // the same for the state's padding (QAdam's momentum), so the JAX adapter,
  // which rebuilds its buckets from the leaves each step, gets the same numbers
  if (padding)
    for (const Span& s : state) std::memset(static_cast<char*>(s.data) + s.nbytes() - padding, 0, padding);
  last_communicated_.store(step_->run_with_state(ctx, data, result, state, step));
}

bool StepOp::predict_calls(const Communicator& comm, std::vector<OpDesc>* calls) const {
  if (!bucket_) return false;
  const Span data{bucket_->data(), bucket_->numel(), bucket_->dtype()};
  return step_->predict_calls(comm, data, counter_.load(), calls);
}

bool StepOp::copy_back() {
  if (!bucket_) throw InvalidArgument(describe() + " is not part of a bucket's chain");
  if (running_.load()) throw Error(describe() + ": copy_back() while the op runs; call the engine's wait() first");
  if (!result_ || !last_communicated_.load()) return false;
  std::memcpy(bucket_->data(), result_.get(), bucket_->nbytes());
  return true;
}

}  // namespace bagua
