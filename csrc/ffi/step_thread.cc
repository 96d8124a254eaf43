#include "ffi/step_thread.h"

#include <condition_variable>
#include <deque>
#include <mutex>
#include <thread>

namespace bagua {
namespace ffi {
namespace {

class StepThread {
 public:
  StepThread() : thread_([this] { loop(); }) {}
  ~StepThread() {
    {
      std::lock_guard<std::mutex> g(mu_);
      stop_ = true;
    }
    cv_.notify_one();
    thread_.join();
  }

  void post(std::function<void()> work) {
    {
      std::lock_guard<std::mutex> g(mu_);
      queue_.push_back(std::move(work));
    }
    cv_.notify_one();
  }

 private:
  void loop() {
    for (;;) {
      std::function<void()> work;
      {
        std::unique_lock<std::mutex> lk(mu_);
        cv_.wait(lk, [this] { return stop_ || !queue_.empty(); });
        if (queue_.empty()) return;  // stopping, nothing left
        work = std::move(queue_.front());
        queue_.pop_front();
      }
      work();
    }
  }

  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::function<void()>> queue_;
  bool stop_ = false;
  std::thread thread_;  // last: starts once the rest is built
};

}  // namespace

void run_on_step_thread(std::function<void()> work) {
  static StepThread thread;
  thread.post(std::move(work));
}

}  // namespace ffi
}  // namespace bagua
