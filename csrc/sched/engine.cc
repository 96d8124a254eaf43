#include "sched/engine.h"

#include "ops/exchange_worker.h"

#include <algorithm>

#include "common/error.h"

namespace bagua {
namespace {

using Clock = std::chrono::steady_clock;

Clock::time_point from_ns(int64_t ns) { return Clock::time_point(std::chrono::nanoseconds(ns)); }

}  // namespace

int64_t monotonic_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::now().time_since_epoch()).count();
}

Engine::Engine(std::vector<CommSet> lanes, std::chrono::milliseconds timeout) : timeout_(timeout) {
  if (lanes.empty()) throw InvalidArgument("engine: at least one lane of communicators is required");
  for (size_t l = 0; l < lanes.size(); ++l) {
    if (!lanes[l].global) throw InvalidArgument("engine: a global communicator is required");
    const Communicator& first = *lanes.front().global;
    if (lanes[l].global->size() != first.size() || lanes[l].global->rank() != first.rank())
      throw InvalidArgument("engine: the communicators of every lane must span the same ranks");
    for (size_t k = 0; k < l; ++k)  // one comm thread per communicator
      if (lanes[k].global == lanes[l].global) throw InvalidArgument("engine: every lane needs its own communicator");
  }
  if (timeout_.count() <= 0) throw InvalidArgument("engine: timeout must be positive");
  lanes_.resize(lanes.size());
  for (size_t l = 0; l < lanes.size(); ++l) lanes_[l].comms = std::move(lanes[l]);
  for (size_t l = 0; l < lanes_.size(); ++l) lanes_[l].thread = std::thread([this, l] { comm_loop(l); });
}

Engine::~Engine() { close(); }

void Engine::close() {
  {
    std::lock_guard<std::mutex> g(mu_);
    if (closed_) return;
    closed_ = true;
    stop_ = true;
  }
  work_cv_.notify_all();
  done_cv_.notify_all();
  for (Lane& lane : lanes_)
    if (lane.thread.joinable()) lane.thread.join();
  // exchanges a step left running (streaming local steps) finish before the lanes' groups close
  for (Lane& lane : lanes_)
    if (lane.comms.global) ExchangeWorker::drain(lane.comms.global.get(), timeout_ * 3);
}

// ---- registration ---------------------------------------------------------------

void Engine::check_usable_locked() const {
  if (closed_) throw Error("engine is closed");
}

void Engine::check_idle_locked(const char* what) const {
  check_usable_locked();
  if (in_step_) throw InvalidArgument(std::string(what) + " during a step: call wait() first");
}

size_t Engine::add_bucket(BucketPtr bucket) {
  if (!bucket) throw InvalidArgument("add_bucket: bucket is null");
  std::lock_guard<std::mutex> g(mu_);
  check_idle_locked("add_bucket");
  const size_t index = entries_.size();
  for (const auto& e : entries_)
    if (e.bucket == bucket || e.bucket->name() == bucket->name())
      throw InvalidArgument("add_bucket: a bucket named '" + bucket->name() + "' is already registered");
  for (const auto& s : bucket->slots()) {
    auto it = by_name_.find(s.name);
    if (it != by_name_.end())
      throw InvalidArgument("add_bucket: tensor '" + s.name + "' of bucket '" + bucket->name() +
                            "' is already in bucket '" + entries_[it->second.first].bucket->name() + "'");
  }
  if (entries_.empty()) {
    use_device_locked(bucket->device());
  } else if (bucket->device() != device_) {
    throw InvalidArgument("add_bucket: bucket '" + bucket->name() + "' is on " +
                          (bucket->device() ? bucket->device()->describe() : std::string("host memory")) +
                          " but the engine's buckets are on " +
                          (device_ ? device_->describe() : std::string("host memory")) + " (one device per engine)");
  }
  Entry e;
  e.bucket = bucket;
  if (device_) {
    e.ready_event = device_->new_event();
    e.done_event = device_->new_event();
  }
  e.ready.assign(bucket->num_slots(), 0);
  e.slot_ready_ns.assign(bucket->num_slots(), -1);
  for (size_t i = 0; i < bucket->num_slots(); ++i) {
    by_name_[bucket->slot(i).name] = {index, i};
    if (bucket->slot(i).is_padding) {
      e.ready[i] = 1;
      ++e.padding_count;
    }
  }
  e.ready_count = e.padding_count;
  entries_.push_back(std::move(e));
  return index;
}

void Engine::use_device_locked(const DevicePtr& device) {
  if (device == device_) return;
  device_ = device;
  for (Lane& lane : lanes_) lane.stream = device_ ? device_->new_stream() : nullptr;
}

void Engine::clear_buckets() {
  std::lock_guard<std::mutex> g(mu_);
  check_idle_locked("clear_buckets");
  entries_.clear();
  by_name_.clear();
}

size_t Engine::num_buckets() const {
  std::lock_guard<std::mutex> g(mu_);
  return entries_.size();
}

BucketPtr Engine::bucket(size_t index) const {
  std::lock_guard<std::mutex> g(mu_);
  if (index >= entries_.size())
    throw InvalidArgument("no bucket " + std::to_string(index) + " (the engine has " + std::to_string(entries_.size()) +
                          ")");
  return entries_[index].bucket;
}

void Engine::append_op(size_t bucket, OpPtr op) {
  if (!op) throw InvalidArgument("append_op: op is null");
  std::lock_guard<std::mutex> g(mu_);
  check_idle_locked("append_op");
  if (bucket >= entries_.size()) throw InvalidArgument("append_op: no bucket " + std::to_string(bucket));
  op->bind(entries_[bucket].bucket, lanes_[bucket % lanes_.size()].stream);
  entries_[bucket].ops.push_back(std::move(op));
}

void Engine::clear_ops(size_t bucket) {
  std::lock_guard<std::mutex> g(mu_);
  check_idle_locked("clear_ops");
  if (bucket >= entries_.size()) throw InvalidArgument("clear_ops: no bucket " + std::to_string(bucket));
  entries_[bucket].ops.clear();
}

std::vector<OpPtr> Engine::ops(size_t bucket) const {
  std::lock_guard<std::mutex> g(mu_);
  if (bucket >= entries_.size()) throw InvalidArgument("ops: no bucket " + std::to_string(bucket));
  return entries_[bucket].ops;
}

// ---- readiness --------------------------------------------------------------------

void Engine::begin_step_locked() {
  in_step_ = true;
  for (auto& e : entries_) {
    e.timing = BucketTiming{};
    if (record_ready_) std::fill(e.slot_ready_ns.begin(), e.slot_ready_ns.end(), -1);
  }
}

void Engine::mark_locked(size_t bucket, size_t slot) {
  if (bucket >= entries_.size())
    throw InvalidArgument("mark_ready: no bucket " + std::to_string(bucket) + " (the engine has " +
                          std::to_string(entries_.size()) + ")");
  Entry& e = entries_[bucket];
  if (slot >= e.ready.size())
    throw InvalidArgument("mark_ready: bucket '" + e.bucket->name() + "' has no slot " + std::to_string(slot));
  if (e.bucket->slot(slot).is_padding) return;  // always ready
  if (!broken_.empty()) return;                 // wait() reports the failure
  if (!in_step_) begin_step_locked();
  if (e.ready[slot])
    throw InvalidArgument("tensor '" + e.bucket->slot(slot).name + "' of bucket '" + e.bucket->name() +
                          "' was marked ready twice in one step (call wait() to end a step)");
  e.ready[slot] = 1;
  ++e.ready_count;
  if (record_ready_) {
    const int64_t now = monotonic_ns();
    e.slot_ready_ns[slot] = now;
    if (e.ready_count == e.ready.size()) e.timing.ready_ns = now;
  }
}

void Engine::launch_ready_locked(const std::optional<Stream>& producer) {
  bool launched = false;
  while (next_launch_ < entries_.size() && entries_[next_launch_].ready_count == entries_[next_launch_].ready.size()) {
    Entry& e = entries_[next_launch_];
    if (device_ && producer) {
      device_->record(e.ready_event, *producer);  // throws for a foreign stream: the caller's bug
      e.ready_recorded = true;
    }
    BucketTiming& t = e.timing;
    t.launch_ns = monotonic_ns();
    if (record_ready_ && t.ready_ns < 0) t.ready_ns = t.launch_ns;  // padding only: ready from the start
    lanes_[next_launch_ % lanes_.size()].queue.push_back(next_launch_);
    ++next_launch_;
    ++launches_;
    launched = true;
  }
  if (launched) work_cv_.notify_all();
}

void Engine::mark_ready(size_t bucket, size_t slot, std::optional<Stream> producer) {
  std::lock_guard<std::mutex> g(mu_);
  check_usable_locked();
  mark_locked(bucket, slot);
  launch_ready_locked(producer);
}

void Engine::mark_ready(const std::string& slot_name, std::optional<Stream> producer) {
  std::lock_guard<std::mutex> g(mu_);
  check_usable_locked();
  auto it = by_name_.find(slot_name);
  if (it == by_name_.end()) throw InvalidArgument("mark_ready: no tensor named '" + slot_name + "' in any bucket");
  mark_locked(it->second.first, it->second.second);
  launch_ready_locked(producer);
}

void Engine::mark_bucket_ready(size_t bucket, std::optional<Stream> producer) {
  std::lock_guard<std::mutex> g(mu_);
  check_usable_locked();
  if (bucket >= entries_.size()) throw InvalidArgument("mark_bucket_ready: no bucket " + std::to_string(bucket));
  for (size_t s = 0; s < entries_[bucket].ready.size(); ++s)
    if (!entries_[bucket].ready[s]) mark_locked(bucket, s);
  launch_ready_locked(producer);
}

void Engine::mark_all_ready(std::optional<Stream> producer) {
  std::lock_guard<std::mutex> g(mu_);
  check_usable_locked();
  for (size_t b = 0; b < entries_.size(); ++b)
    for (size_t s = 0; s < entries_[b].ready.size(); ++s)
      if (!entries_[b].ready[s]) mark_locked(b, s);
  launch_ready_locked(producer);
}

// ---- the comm threads, one per lane --------------------------------------------------

void Engine::comm_loop(size_t lane) {
  std::deque<size_t>& queue = lanes_[lane].queue;
  Communicator& global = *lanes_[lane].comms.global;
  std::unique_lock<std::mutex> lk(mu_);
  for (;;) {
    work_cv_.wait(lk, [&] { return stop_ || !queue.empty(); });
    if (stop_) {
      queue.clear();
      return;
    }
    const size_t index = queue.front();
    queue.pop_front();
    BucketPtr bucket = entries_[index].bucket;
    std::vector<OpPtr> ops = entries_[index].ops;
    const DevicePtr device = device_;
    const Stream stream = lanes_[lane].stream;  // set with the first device bucket
    const DeviceEventPtr ready_event = entries_[index].ready_recorded ? entries_[index].ready_event : nullptr;
    const DeviceEventPtr done_event = entries_[index].done_event;
    entries_[index].timing.start_ns = monotonic_ns();
    const bool skip = !broken_.empty();
    std::vector<OpDesc> promise;
    if (index == lane && !skip) promise = predict_step_locked(lane);  // the lane's first bucket of the step
    lk.unlock();

    std::exception_ptr error;
    std::string failed_op;
    if (promise.size() > 1) {
      try {
        global.expect_calls(promise);
      } catch (...) {
        error = std::current_exception();
        failed_op = "expect_calls";
      }
    }
    if (!skip && !error && ready_event) {
      try {
        device->wait(stream, ready_event);
      } catch (...) {
        error = std::current_exception();
        failed_op = "waiting for the producer stream";
      }
    }
    if (!skip && !error) {
      for (auto& op : ops) {
        try {
          op->execute(*bucket);
        } catch (...) {
          error = std::current_exception();
          failed_op = op->describe();
          break;
        }
      }
    }
    if (!skip && !error && device) {
      try {
        device->record(done_event, stream);
      } catch (...) {
        error = std::current_exception();
        failed_op = "recording the bucket's end";
      }
    }

    lk.lock();
    entries_[index].timing.end_ns = monotonic_ns();
    entries_[index].finished = true;
    ++finished_;
    if (error) {
      const std::string prefix = bucket->describe(position(index)) + " failed in " + failed_op + ": ";
      fail_locked(with_prefix(error, prefix));
    }
    done_cv_.notify_all();
  }
}

// The collectives of the step's buckets on `lane`, in order, as far as their
// ops know them beforehand (up to the first bucket whose ops cannot say):
// promised to the lane's communicator, they need one agreement between the
// ranks instead of one per bucket.
std::vector<OpDesc> Engine::predict_step_locked(size_t lane) const {
  std::vector<OpDesc> calls;
  for (size_t b = lane; b < entries_.size(); b += lanes_.size()) {
    const Entry& e = entries_[b];
    const size_t before = calls.size();
    for (const auto& op : e.ops) {
      if (!op->predict_calls(*lanes_[lane].comms.global, &calls)) {
        calls.resize(before);
        return calls;
      }
    }
  }
  return calls;
}

// ---- ending a step ----------------------------------------------------------------

void Engine::fail_locked(std::exception_ptr error) {
  if (!error_) error_ = error;
  if (broken_.empty()) {
    try {
      std::rethrow_exception(error_);
    } catch (const std::exception& e) {
      broken_ = e.what();
    }
  }
  done_cv_.notify_all();
}

void Engine::reset_step_locked() {
  for (auto& e : entries_) {
    for (size_t s = 0; s < e.ready.size(); ++s) e.ready[s] = e.bucket->slot(s).is_padding ? 1 : 0;
    e.ready_count = e.padding_count;
    e.finished = false;
    e.ready_recorded = false;
  }
  next_launch_ = 0;
  finished_ = 0;
  in_step_ = false;
}

size_t Engine::first_unfinished_locked() const {
  for (size_t b = 0; b < next_launch_; ++b)
    if (!entries_[b].finished) return b;
  return next_launch_;
}

std::string Engine::position(size_t index) const {
  return "#" + std::to_string(index) + " of " + std::to_string(entries_.size());
}

std::string Engine::unready_report_locked() const {
  const Entry& first = entries_[next_launch_];
  std::vector<size_t> missing;
  for (size_t s = 0; s < first.ready.size(); ++s)
    if (!first.ready[s]) missing.push_back(s);
  std::string msg = first.bucket->describe(position(next_launch_)) + " did not launch within " + seconds(timeout_) +
                    " of wait(): tensors never marked ready: " + first.bucket->list_slots(missing) + " (" +
                    std::to_string(first.ready_count - first.padding_count) + " of " +
                    std::to_string(first.ready.size() - first.padding_count) + " ready)";
  size_t later = 0;
  for (size_t b = next_launch_ + 1; b < entries_.size(); ++b)
    later += entries_[b].ready.size() - entries_[b].ready_count;
  if (later) msg += "; later buckets miss " + std::to_string(later) + " more";
  if (first_unfinished_locked() < next_launch_)
    msg += "; bucket #" + std::to_string(first_unfinished_locked()) + " is still communicating";
  return msg;
}

void Engine::raise_failure_locked() {
  if (!error_raised_) {
    error_raised_ = true;
    std::rethrow_exception(error_);
  }
  throw Error("the engine is unusable after an earlier failure: " + broken_);
}

void Engine::await_locked(std::unique_lock<std::mutex>& lk, const std::function<bool()>& done, size_t must_launch) {
  const auto begun = Clock::now();
  const auto unready_deadline = begun + timeout_;
  const auto watchdog = timeout_ + timeout_ / 2;
  auto watchdog_deadline = [&](size_t running) {
    const BucketTiming& t = entries_[running].timing;
    return std::max(begun, from_ns(t.start_ns >= 0 ? t.start_ns : t.launch_ns)) + watchdog;
  };
  for (;;) {
    if (closed_) throw Error("engine closed during wait()");
    const size_t running = first_unfinished_locked();
    // After a failure the buckets other lanes still run end first (or meet the
    // watchdog): once wait() raises, no comm thread touches the buckets.
    if (error_ && running == next_launch_) raise_failure_locked();
    if (!error_ && done()) return;
    auto deadline = Clock::time_point::max();
    if (!error_ && next_launch_ < must_launch) deadline = unready_deadline;
    if (running < next_launch_) deadline = std::min(deadline, watchdog_deadline(running));
    if (done_cv_.wait_until(lk, deadline) == std::cv_status::no_timeout) continue;
    const auto now = Clock::now();
    if (now < deadline) continue;
    if (error_) raise_failure_locked();  // a bucket still in flight after the failure overran the watchdog
    if (done()) continue;
    if (next_launch_ < must_launch && now >= unready_deadline) {
      fail_locked(std::make_exception_ptr(TimeoutError(unready_report_locked())));
      continue;
    }
    const size_t late = first_unfinished_locked();
    if (late < next_launch_ && now >= watchdog_deadline(late)) {
      const Entry& e = entries_[late];
      fail_locked(std::make_exception_ptr(
          TimeoutError(e.bucket->describe(position(late)) + " did not finish within " +
                       seconds(std::chrono::duration_cast<std::chrono::milliseconds>(watchdog)) +
                       " of its start (a peer may be stuck)")));
      raise_failure_locked();
    }
    // else a launch moved the deadlines (launches do not notify done_cv_): look again
  }
}

void Engine::wait(std::optional<Stream> consumer) {
  std::unique_lock<std::mutex> lk(mu_);
  check_usable_locked();
  if (error_ && error_raised_) raise_failure_locked();
  if (!in_step_ && !error_) return;
  const size_t n = entries_.size();
  await_locked(lk, [&] { return next_launch_ == n && finished_ == n; }, n);
  std::vector<DeviceEventPtr> done;
  for (const auto& e : entries_) done.push_back(e.done_event);
  reset_step_locked();
  ++steps_;
  if (device_) finish_on_device_locked(lk, consumer, done);
}

size_t Engine::wait_any(const std::vector<size_t>& buckets, std::optional<Stream> consumer) {
  std::unique_lock<std::mutex> lk(mu_);
  check_usable_locked();
  if (buckets.empty()) throw InvalidArgument("wait_any: no bucket given");
  for (size_t b : buckets)
    if (b >= entries_.size())
      throw InvalidArgument("wait_any: no bucket " + std::to_string(b) + " (the engine has " +
                            std::to_string(entries_.size()) + ")");
  if (error_ && error_raised_) raise_failure_locked();
  const size_t lowest = *std::min_element(buckets.begin(), buckets.end());
  if (!in_step_ && !error_) return lowest;
  size_t found = 0;
  await_locked(
      lk,
      [&] {
        bool any = false;
        for (size_t b : buckets) {
          if (b < next_launch_ && entries_[b].finished && (!any || b < found)) {
            found = b;
            any = true;
          }
        }
        return any;
      },
      lowest + 1);
  if (device_) finish_on_device_locked(lk, consumer, {entries_[found].done_event});
  return found;
}

// The device work of finished buckets (their done events): the consumer
// stream waits for it, or the caller does (the lock released: a stuck device
// must not block other callers). A failure there breaks the engine like a
// comm thread's.
void Engine::finish_on_device_locked(std::unique_lock<std::mutex>& lk, const std::optional<Stream>& consumer,
                                     const std::vector<DeviceEventPtr>& done) {
  const DevicePtr device = device_;
  std::exception_ptr error;
  if (consumer) {
    try {
      for (const auto& event : done) device->wait(*consumer, event);
    } catch (...) {
      error = std::current_exception();
    }
  } else {
    lk.unlock();
    try {
      for (const auto& event : done) device->synchronize(event, timeout_ + timeout_ / 2);
    } catch (...) {
      error = std::current_exception();
    }
    lk.lock();
  }
  if (!error) return;
  fail_locked(with_prefix(error, "the device's work of the step failed: "));
  error_raised_ = true;
  std::rethrow_exception(error_);
}

// ---- observation --------------------------------------------------------------------

std::vector<BucketTiming> Engine::timings() const {
  std::lock_guard<std::mutex> g(mu_);
  std::vector<BucketTiming> out;
  for (const auto& e : entries_) out.push_back(e.timing);
  return out;
}

void Engine::set_record_ready(bool on) {
  std::lock_guard<std::mutex> g(mu_);
  check_idle_locked("set_record_ready");
  record_ready_ = on;
}

bool Engine::record_ready() const {
  std::lock_guard<std::mutex> g(mu_);
  return record_ready_;
}

std::vector<int64_t> Engine::slot_ready_ns(size_t bucket) const {
  std::lock_guard<std::mutex> g(mu_);
  if (bucket >= entries_.size()) throw InvalidArgument("slot_ready_ns: no bucket " + std::to_string(bucket));
  return entries_[bucket].slot_ready_ns;
}

uint64_t Engine::launches() const {
  std::lock_guard<std::mutex> g(mu_);
  return launches_;
}

uint64_t Engine::steps() const {
  std::lock_guard<std::mutex> g(mu_);
  return steps_;
}

bool Engine::in_step() const {
  std::lock_guard<std::mutex> g(mu_);
  return in_step_;
}

bool Engine::broken() const {
  std::lock_guard<std::mutex> g(mu_);
  return !broken_.empty();
}

}  // namespace bagua
