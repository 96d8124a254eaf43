// A thread per communicator that runs exchanges in the order they were submitted, so a step may
// leave an exchange running while training goes on (streaming local steps, ops/local_steps.h).
//
// Contract: every rank submits the same exchanges in the same order (the steps submit at the same
// step numbers in bucket order), so the worker threads of the ranks call the communicator's
// collectives in one order. While a worker holds queued exchanges, nothing else may call
// collectives on its communicator (the streaming step sends everything it communicates after its
// warm-up through the worker). A failed exchange's exception is delivered by its future; later
// exchanges still run (each rank sees the same failure). The destructor runs what is queued, then
// joins; an engine drains the workers of its communicators before it closes them (drain()).
#pragma once

#include <chrono>
#include <condition_variable>
#include <deque>
#include <functional>
#include <future>
#include <memory>
#include <mutex>
#include <thread>

#include "comm/communicator.h"

namespace bagua {

class ExchangeWorker {
 public:
  // The worker of `comm`: one per communicator object in this process, made on first use, kept
  // while anyone holds it.
  static std::shared_ptr<ExchangeWorker> of(const CommunicatorPtr& comm);

  explicit ExchangeWorker(CommunicatorPtr comm);
  ~ExchangeWorker();
  ExchangeWorker(const ExchangeWorker&) = delete;
  ExchangeWorker& operator=(const ExchangeWorker&) = delete;

  std::shared_future<void> submit(std::function<void()> exchange);
  // Waits, at most `timeout`, until the worker of `comm` (if any) has run everything queued, so the
  // communicator may carry other collectives or close. Returns false on timeout.
  static bool drain(const Communicator* comm, std::chrono::milliseconds timeout);
  const CommunicatorPtr& comm() const { return comm_; }

 private:
  void loop();

  CommunicatorPtr comm_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::condition_variable idle_cv_;
  std::deque<std::packaged_task<void()>> queue_;
  bool running_ = false;
  bool stop_ = false;
  std::thread thread_;
};

}  // namespace bagua
