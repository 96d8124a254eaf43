// One long-lived thread that runs one job at a time for the communicator
// (drives an extra Gloo connection while the caller drives the first one).
#pragma once

#include <condition_variable>
#include <exception>
#include <functional>
#include <mutex>
#include <thread>

namespace bagua {

class LaneWorker {
 public:
  LaneWorker() : thread_([this] { loop(); }) {}
  ~LaneWorker() {
    {
      std::lock_guard<std::mutex> g(m_);
      stop_ = true;
    }
    cv_.notify_all();
    thread_.join();
  }
  LaneWorker(const LaneWorker&) = delete;
  LaneWorker& operator=(const LaneWorker&) = delete;

  void submit(std::function<void()> job) {
    {
      std::lock_guard<std::mutex> g(m_);
      job_ = std::move(job);
      done_ = false;
      error_ = nullptr;
    }
    cv_.notify_all();
  }

  // Waits for the submitted job; returns its exception, if any.
  std::exception_ptr wait() {
    std::unique_lock<std::mutex> g(m_);
    cv_.wait(g, [this] { return done_; });
    return error_;
  }

 private:
  void loop() {
    std::unique_lock<std::mutex> g(m_);
    for (;;) {
      cv_.wait(g, [this] { return stop_ || job_; });
      if (stop_) return;
      auto job = std::move(job_);
      job_ = nullptr;
      g.unlock();
      std::exception_ptr err;
      try {
        job();
      } catch (...) {
        err = std::current_exception();
      }
      g.lock();
      error_ = err;
      done_ = true;
      cv_.notify_all();
    }
  }

  std::mutex m_;
  std::condition_variable cv_;
  std::function<void()> job_;
  bool done_ = true;
  bool stop_ = false;
  std::exception_ptr error_;
  std::thread thread_;  // last: starts after the members above exist
};

}  // namespace bagua
