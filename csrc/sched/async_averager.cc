#include "sched/async_averager.h"

#include <cstring>
#include <string>

#include "bucket/host_memory.h"
#include "common/error.h"
#include "ops/kernels.h"

namespace bagua {
namespace {

struct Closing {};  // unwinds the loop when close() interrupts a wait (weight lock, test hold)

}  // namespace

// The loop's hold of the weight lock (priority over the training thread).
class AsyncAverager::LoopLock {
 public:
  explicit LoopLock(AsyncAverager& a) : a_(a) {
    std::unique_lock<std::mutex> l(a_.mu_);
    a_.loop_waiting_ = true;
    a_.cv_.wait(l, [&] { return !a_.held_ || a_.closing_; });
    a_.loop_waiting_ = false;
    if (a_.closing_) {
      a_.cv_.notify_all();
      throw Closing{};
    }
    a_.held_ = true;
  }
  ~LoopLock() {
    {
      std::lock_guard<std::mutex> l(a_.mu_);
      a_.held_ = false;
    }
    a_.cv_.notify_all();
  }

 private:
  AsyncAverager& a_;
};

AsyncAverager::AsyncAverager(std::shared_ptr<const AsyncModelAverageStep> step, std::vector<BucketPtr> weights,
                             std::chrono::milliseconds timeout, CommunicatorPtr control)
    : step_(std::move(step)), weights_(std::move(weights)), timeout_(timeout) {
  if (!step_) throw InvalidArgument("AsyncAverager: no step");
  if (weights_.empty()) throw InvalidArgument("AsyncAverager: no weights to average");
  control_ = control ? std::move(control) : step_->comm();
  if (control_->device_type() != DeviceType::kCPU)
    throw InvalidArgument("AsyncAverager: the stop flags need a host communicator (pass control=)");
  for (const auto& b : weights_) {
    if (!b) throw InvalidArgument("AsyncAverager: a weight bucket is None");
    if (b->device() != weights_[0]->device())
      throw InvalidArgument("AsyncAverager: the weight buckets are on different devices");
  }
  device_ = weights_[0]->device();
  if (device_) {
    stream_ = device_->new_stream();
    training_done_ = device_->new_event();
    scratch_ = GrowOnlyScratch(device_);
  }
  for (const auto& b : weights_) {
    step_->check(b->dtype(), b->numel());
    snapshots_.push_back(device_ ? device_->allocate(b->nbytes()) : allocate_host_memory(b->nbytes()));
    averages_.push_back(device_ ? device_->allocate(b->nbytes()) : allocate_host_memory(b->nbytes()));
  }
}

AsyncAverager::~AsyncAverager() { close(); }

void AsyncAverager::raise_locked() const {
  if (error_) std::rethrow_exception(error_);
}

void AsyncAverager::check() const {
  std::lock_guard<std::mutex> l(mu_);
  raise_locked();
}

bool AsyncAverager::running() const {
  std::lock_guard<std::mutex> l(mu_);
  return running_;
}

uint64_t AsyncAverager::rounds() const {
  std::lock_guard<std::mutex> l(mu_);
  return rounds_;
}

void AsyncAverager::join_finished() {
  // called without mu_, when running_ is false: the thread is ending or ended
  if (thread_.joinable()) thread_.join();
}

void AsyncAverager::start() {
  {
    std::lock_guard<std::mutex> l(mu_);
    if (closing_) throw Error(describe() + ": start() after close()");
    raise_locked();
    if (running_) return;
  }
  join_finished();
  std::lock_guard<std::mutex> l(mu_);
  stop_requested_ = false;
  finishing_ = false;
  running_ = true;
  thread_ = std::thread([this] { loop(); });
}

void AsyncAverager::abort() {
  {
    std::unique_lock<std::mutex> l(mu_);
    if (running_) {
      stop_requested_ = true;
      cv_.notify_all();
      if (!cv_.wait_for(l, timeout_, [&] { return !running_; })) {
        stop_requested_ = false;  // withdrawn: see the header
        // bounded by the round's own collective timeout
        cv_.wait(l, [&] { return !deciding_ || !running_; });
        if (!finishing_)
          throw TimeoutError(describe() + ": abort() waited " + seconds(timeout_) +
                             " for the other ranks to call abort() too; the averaging goes on: call abort() on "
                             "every rank");
        cv_.wait(l, [&] { return !running_; });
      }
    }
  }
  join_finished();
  check();
}

void AsyncAverager::lock_weights() {
  std::unique_lock<std::mutex> l(mu_);
  cv_.wait(l, [&] { return error_ || (!held_ && !loop_waiting_); });
  raise_locked();
  held_ = true;
}

void AsyncAverager::unlock_weights(std::optional<Stream> producer) {
  {
    std::lock_guard<std::mutex> l(mu_);
    if (device_ && producer) {
      device_->record(training_done_, *producer);
      training_recorded_ = true;
    }
    held_ = false;
  }
  cv_.notify_all();
}

void AsyncAverager::close() {
  {
    std::lock_guard<std::mutex> l(mu_);
    closing_ = true;
  }
  cv_.notify_all();
  join_finished();
}

void AsyncAverager::test_hold(bool on) {
  {
    std::lock_guard<std::mutex> l(mu_);
    test_hold_ = on;
  }
  cv_.notify_all();
}

bool AsyncAverager::test_wait_held(std::chrono::milliseconds timeout) {
  std::unique_lock<std::mutex> l(mu_);
  return cv_.wait_for(l, timeout, [&] { return test_held_ && !test_release_; });
}

void AsyncAverager::test_release_held() {
  {
    std::lock_guard<std::mutex> l(mu_);
    if (test_held_) test_release_ = true;
  }
  cv_.notify_all();
}

void AsyncAverager::round() {
  const ExecContext ctx{device_ ? device_->type() : DeviceType::kCPU, stream_, &scratch_, device_.get()};
  // Under the weight lock, on a device: after the training stream's last
  // change, and done before the lock is released.
  auto after_training = [&] {
    if (device_ && training_recorded_) device_->wait(stream_, training_done_);
  };
  auto done_before_unlock = [&] {
    if (device_) device_->synchronize(stream_, timeout_);
  };
  std::vector<Span> w, snap, avg;
  for (size_t i = 0; i < weights_.size(); ++i) {
    const auto& b = weights_[i];
    w.push_back(Span{b->data(), b->numel(), b->dtype()});
    snap.push_back(Span{snapshots_[i].get(), b->numel(), b->dtype()});
    avg.push_back(Span{averages_[i].get(), b->numel(), b->dtype()});
  }
  {
    LoopLock hold(*this);
    after_training();
    for (size_t i = 0; i < w.size(); ++i) step_kernels::copy(ctx, snap[i].data, w[i].data, w[i].nbytes());
    done_before_unlock();
  }
  {
    std::unique_lock<std::mutex> l(mu_);
    if (test_hold_) {
      test_held_ = true;
      cv_.notify_all();
      cv_.wait(l, [&] { return !test_hold_ || test_release_ || closing_; });
      test_held_ = test_release_ = false;
      if (closing_) throw Closing{};
    }
  }
  for (size_t i = 0; i < w.size(); ++i) step_->run(ctx, snap[i], avg[i], 0);
  {
    LoopLock hold(*this);
    after_training();
    for (size_t i = 0; i < w.size(); ++i) step_->apply(ctx, w[i], snap[i], avg[i]);
    done_before_unlock();
  }
  std::lock_guard<std::mutex> l(mu_);
  ++rounds_;
}

void AsyncAverager::loop() {
  const auto interval = std::chrono::milliseconds(step_->sync_interval_ms());
  try {
    while (true) {
      bool stop;
      {
        // a pause first: the weights are equal when the loop starts (after the
        // warm-up, or abort()), and a round right away would average nothing
        std::unique_lock<std::mutex> l(mu_);
        cv_.wait_for(l, interval, [&] { return stop_requested_ || closing_; });
        if (closing_) break;
        stop = stop_requested_;
        deciding_ = true;
      }
      const bool all = step_->all_stopped(*control_, stop);
      {
        std::lock_guard<std::mutex> l(mu_);
        deciding_ = false;
        finishing_ = all;
      }
      cv_.notify_all();
      round();
      if (all) break;  // that was the last round, with training stopped on every rank
    }
  } catch (const Closing&) {
  } catch (...) {
    std::lock_guard<std::mutex> l(mu_);
    error_ = with_prefix(std::current_exception(), describe() + " (background loop): ");
  }
  {
    std::lock_guard<std::mutex> l(mu_);
    running_ = false;
    deciding_ = false;
  }
  cv_.notify_all();
}

}  // namespace bagua
