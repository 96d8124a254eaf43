#include "sched/bucket_step_op.h"

#include <cstring>

#include "bucket/host_memory.h"
#include "common/error.h"
#include "ops/kernels.h"

namespace bagua {
namespace {

// Bind-time copies and copy_back without a framework stream wait this long for
// the device: a stuck device is a failure, not a hang.
constexpr std::chrono::milliseconds kBindTimeout{10 * 60 * 1000};

}  // namespace

StepOp::StepOp(StepPtr step) : step_(std::move(step)) {
  if (!step_) throw InvalidArgument("StepOp: no step");
}

void StepOp::set_step(int64_t step) {
  if (step < 0) throw InvalidArgument(describe() + ": step must be >= 0");
  counter_.store(step);
}

ExecContext StepOp::context(Bucket& bucket) {
  return ExecContext{bucket.device_type(), stream_, &scratch_, bucket.device().get()};
}

void StepOp::bind(const BucketPtr& bucket, Stream stream) {
  if (bucket_) throw InvalidArgument(describe() + " is already part of another bucket's chain");
  try {
    step_->check(bucket->dtype(), bucket->numel());
  } catch (const InvalidArgument& e) {
    throw InvalidArgument(std::string(e.what()) + " [" + bucket->describe() +
                          "; create the bucket with alignment = the group size where the step needs it]");
  }
  const DevicePtr& device = bucket->device();
  if (device && !stream) throw InvalidArgument(describe() + ": a device bucket needs its lane's stream");
  stream_ = stream;
  scratch_ = GrowOnlyScratch(device);
  auto allocate = [&](size_t nbytes) { return device ? device->allocate(nbytes) : allocate_host_memory(nbytes); };
  const ExecContext ctx = context(*bucket);
  if (step_->has_result()) {
    result_ = allocate(bucket->nbytes());
    step_kernels::copy(ctx, result_.get(), bucket->data(), bucket->nbytes());
  }
  if (step_->num_state() > 0) {
    state_layout_ = step_->state_layout(bucket->dtype(), bucket->numel());
    state_ = allocate(state_layout_.nbytes());
    if (state_layout_.init == StateInit::kCopyOfData) {
      for (int k = 0; k < state_layout_.spans; ++k)
        step_kernels::copy(ctx, static_cast<char*>(state_.get()) + k * bucket->nbytes(), bucket->data(),
                           bucket->nbytes());
    } else {
      step_kernels::fill_zero(ctx, state_.get(), state_layout_.nbytes());
    }
  }
  if (device) device->synchronize(stream_, kBindTimeout);
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
  const ExecContext ctx = context(bucket);
  if (padding) step_kernels::fill_zero(ctx, static_cast<char*>(bucket.data()) + bucket.nbytes() - padding, padding);
  const Span data{bucket.data(), bucket.numel(), bucket.dtype()};
  const Span result = result_ ? Span{result_.get(), bucket.numel(), bucket.dtype()} : data;
  const std::vector<Span> state =
      state_spans(state_.get(), state_layout_.spans, state_layout_.span_count, state_layout_.dtype);
  // the same for the state's padding (QAdam's momentum), so the JAX adapter,
  // which rebuilds its buckets from the leaves each step, gets the same numbers
  if (padding && state_layout_.data_shaped)
    for (const Span& s : state)
      step_kernels::fill_zero(ctx, static_cast<char*>(s.data) + s.nbytes() - padding, padding);
  last_communicated_.store(step_->run_with_state(ctx, data, result, state, step));
}

bool StepOp::predict_calls(const Communicator& comm, std::vector<OpDesc>* calls) const {
  if (!bucket_) return false;
  const Span data{bucket_->data(), bucket_->numel(), bucket_->dtype()};
  return step_->predict_calls(comm, data, counter_.load(), calls);
}

bool StepOp::copy_back(std::optional<Stream> on) {
  if (!bucket_) throw InvalidArgument(describe() + " is not part of a bucket's chain");
  if (running_.load()) throw Error(describe() + ": copy_back() while the op runs; call the engine's wait() first");
  if (!result_ || !last_communicated_.load()) return false;
  const DevicePtr& device = bucket_->device();
  if (!device) {
    std::memcpy(bucket_->data(), result_.get(), bucket_->nbytes());
    return true;
  }
  const Stream stream = on ? *on : stream_;
  device->copy_async(bucket_->data(), result_.get(), bucket_->nbytes(), stream);
  if (!on) device->synchronize(stream, kBindTimeout);
  return true;
}

}  // namespace bagua
