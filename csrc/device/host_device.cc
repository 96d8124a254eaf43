// The host implementation of Device (device/device.h): host memory, and each
// stream an ordered queue with its own thread, so that the suite exercises the
// device path's ordering (events, waits, asynchronous copies) on a CPU.
#include <algorithm>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <exception>
#include <mutex>
#include <thread>
#include <vector>

#include "buffer/buffer.h"
#include "common/error.h"
#include "device/device.h"

namespace bagua {
namespace {

// What record() leaves behind: how many records were made and how many of
// them their stream reached, with the stream's error at that point.
class HostEvent : public DeviceEvent {
 public:
  std::mutex mu;
  std::condition_variable cv;
  uint64_t recorded = 0;
  uint64_t reached = 0;
  std::exception_ptr error;
};

std::shared_ptr<HostEvent> host_event(const DeviceEventPtr& event) {
  auto e = std::dynamic_pointer_cast<HostEvent>(event);
  if (!e) throw InvalidArgument("host device: the event is missing or belongs to another device");
  return e;
}

class HostQueue {
 public:
  explicit HostQueue(std::chrono::microseconds delay) : delay_(delay), thread_([this] { loop(); }) {}
  ~HostQueue() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      stop_ = true;
    }
    cv_.notify_all();
    thread_.join();
  }

  void push(std::function<void()> fn) { push_task({std::move(fn), false}); }

  // A task marking `event` reached, with this queue's error if any.
  void push_marker(std::shared_ptr<HostEvent> event) {
    uint64_t target;
    {
      std::lock_guard<std::mutex> lock(event->mu);
      target = ++event->recorded;
    }
    push_task({[this, event, target] {
                 std::lock_guard<std::mutex> lock(event->mu);
                 event->reached = std::max(event->reached, target);
                 event->error = error_;
                 event->cv.notify_all();
               },
               true});
  }

  // A task that holds this queue until `event` reaches its latest record.
  void push_wait(std::shared_ptr<HostEvent> event) {
    uint64_t target;
    {
      std::lock_guard<std::mutex> lock(event->mu);
      target = event->recorded;
    }
    push_task({[this, event, target] {
                 std::unique_lock<std::mutex> lock(event->mu);
                 while (event->reached < target && !stopping()) event->cv.wait_for(lock, std::chrono::milliseconds(20));
                 // work after the wait would read what failed work left: fail it too
                 if (event->error && !error_) error_ = event->error;
               },
               true});
  }

 private:
  struct Task {
    std::function<void()> fn;
    bool control;  // markers and waits: they run even on a failed stream
  };

  void push_task(Task task) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (stop_) throw Error("host device stream: enqueue after the device was closed");
      tasks_.push_back(std::move(task));
    }
    cv_.notify_all();
  }

  bool stopping() {
    std::lock_guard<std::mutex> lock(mu_);
    return stop_;
  }

  void loop() {
    for (;;) {
      Task task;
      {
        std::unique_lock<std::mutex> lock(mu_);
        cv_.wait(lock, [this] { return stop_ || !tasks_.empty(); });
        if (tasks_.empty()) return;
        task = std::move(tasks_.front());
        tasks_.pop_front();
        if (stop_ && !task.control) continue;  // closing: drop work, still release waiters
      }
      if (task.control) {
        task.fn();
        continue;
      }
      if (delay_.count() > 0) std::this_thread::sleep_for(delay_);
      if (error_) continue;  // a failed stream runs nothing more (CUDA's sticky errors)
      try {
        task.fn();
      } catch (...) {
        error_ = std::current_exception();
      }
    }
  }

  const std::chrono::microseconds delay_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<Task> tasks_;
  bool stop_ = false;
  std::exception_ptr error_;  // touched by the queue's thread only
  std::thread thread_;
};

class HostDevice : public Device {
 public:
  explicit HostDevice(std::chrono::microseconds delay) : delay_(delay) {}

  DeviceType type() const override { return DeviceType::kCPU; }
  int index() const override { return 0; }
  std::string describe() const override {
    return "host device (ordered queues, " + std::to_string(delay_.count()) + " us per task)";
  }

  std::shared_ptr<void> allocate(size_t nbytes) override {
    std::shared_ptr<Storage> storage = Storage::allocate(nbytes, DeviceType::kCPU, 0, /*zero=*/true);
    void* data = storage->data();
    // the memory keeps the device, and so its queues, alive
    auto owner =
        std::make_shared<std::pair<std::shared_ptr<Storage>, DevicePtr>>(std::move(storage), shared_from_this());
    return std::shared_ptr<void>(owner, data);
  }
  std::shared_ptr<void> allocate_pinned(size_t nbytes) override { return allocate(nbytes); }

  Stream new_stream() override { return new_stream(delay_); }
  Stream new_stream(std::chrono::microseconds delay) {
    std::lock_guard<std::mutex> lock(mu_);
    queues_.push_back(std::make_unique<HostQueue>(delay));
    return queues_.back().get();
  }

  void copy_async(void* dst, const void* src, size_t nbytes, Stream stream) override {
    if (nbytes == 0 || dst == src) return;
    queue(stream).push([=] { std::memmove(dst, src, nbytes); });
  }
  void memset_async(void* dst, int value, size_t nbytes, Stream stream) override {
    if (nbytes == 0) return;
    queue(stream).push([=] { std::memset(dst, value, nbytes); });
  }
  void enqueue_host(Stream stream, std::function<void()> fn) override { queue(stream).push(std::move(fn)); }

  DeviceEventPtr new_event() override { return std::make_shared<HostEvent>(); }
  void record(const DeviceEventPtr& event, Stream stream) override { queue(stream).push_marker(host_event(event)); }
  void wait(Stream stream, const DeviceEventPtr& event) override { queue(stream).push_wait(host_event(event)); }

  void synchronize(const DeviceEventPtr& event, std::chrono::milliseconds timeout) override {
    std::shared_ptr<HostEvent> e = host_event(event);
    std::unique_lock<std::mutex> lock(e->mu);
    const uint64_t target = e->recorded;
    if (!e->cv.wait_for(lock, timeout, [&] { return e->reached >= target; }))
      throw TimeoutError("host device: the stream did not reach the event within " + seconds(timeout));
    if (e->error) std::rethrow_exception(e->error);
  }
  void synchronize(Stream stream, std::chrono::milliseconds timeout) override {
    DeviceEventPtr e = new_event();
    record(e, stream);
    synchronize(e, timeout);
  }

 private:
  HostQueue& queue(Stream stream) {
    if (stream == nullptr) throw InvalidArgument("host device: no stream (make one with new_stream())");
    std::lock_guard<std::mutex> lock(mu_);
    for (auto& q : queues_)
      if (q.get() == stream) return *q;
    throw InvalidArgument("host device: the stream belongs to another device");
  }

  const std::chrono::microseconds delay_;
  std::mutex mu_;
  std::vector<std::unique_ptr<HostQueue>> queues_;
};

}  // namespace

DevicePtr host_device(std::chrono::microseconds delay) {
  if (delay.count() < 0) throw InvalidArgument("host device: delay must be >= 0");
  return std::make_shared<HostDevice>(delay);
}

Stream new_host_stream(Device& host, std::chrono::microseconds delay) {
  auto* d = dynamic_cast<HostDevice*>(&host);
  if (!d) throw InvalidArgument(host.describe() + ": streams with a delay of their own exist on host devices only");
  if (delay.count() < 0) throw InvalidArgument("host device: delay must be >= 0");
  return d->new_stream(delay);
}

}  // namespace bagua
