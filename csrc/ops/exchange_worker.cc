#include "ops/exchange_worker.h"

#include <map>
#include <utility>

namespace bagua {

namespace {

struct Registry {
  std::mutex mu;
  std::map<const Communicator*, std::weak_ptr<ExchangeWorker>> workers;
};

Registry& registry() {
  static Registry r;
  return r;
}

}  // namespace

bool ExchangeWorker::drain(const Communicator* comm, std::chrono::milliseconds timeout) {
  std::shared_ptr<ExchangeWorker> w;
  {
    Registry& r = registry();
    std::lock_guard<std::mutex> lk(r.mu);
    auto it = r.workers.find(comm);
    if (it != r.workers.end()) w = it->second.lock();
  }
  if (!w) return true;
  std::unique_lock<std::mutex> lk(w->mu_);
  return w->idle_cv_.wait_for(lk, timeout, [&] { return w->queue_.empty() && !w->running_; });
}

std::shared_ptr<ExchangeWorker> ExchangeWorker::of(const CommunicatorPtr& comm) {
  Registry& r = registry();
  std::lock_guard<std::mutex> lk(r.mu);
  std::weak_ptr<ExchangeWorker>& slot = r.workers[comm.get()];
  std::shared_ptr<ExchangeWorker> w = slot.lock();
  // a new communicator at a freed one's address gets a new worker
  if (!w || w->comm() != comm) {
    w = std::make_shared<ExchangeWorker>(comm);
    slot = w;
  }
  return w;
}

ExchangeWorker::ExchangeWorker(CommunicatorPtr comm) : comm_(std::move(comm)), thread_([this] { loop(); }) {}

ExchangeWorker::~ExchangeWorker() {
  {
    std::lock_guard<std::mutex> lk(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  thread_.join();
}

std::shared_future<void> ExchangeWorker::submit(std::function<void()> exchange) {
  std::packaged_task<void()> task(std::move(exchange));
  std::shared_future<void> done = task.get_future().share();
  {
    std::lock_guard<std::mutex> lk(mu_);
    queue_.push_back(std::move(task));
  }
  cv_.notify_all();
  return done;
}

void ExchangeWorker::loop() {
  for (;;) {
    std::packaged_task<void()> task;
    {
      std::unique_lock<std::mutex> lk(mu_);
      cv_.wait(lk, [this] { return stop_ || !queue_.empty(); });
      if (queue_.empty()) return;  // stopping, nothing left
      task = std::move(queue_.front());
      queue_.pop_front();
      running_ = true;
    }
    task();  // exceptions go to the task's future
    {
      std::lock_guard<std::mutex> lk(mu_);
      running_ = false;
    }
    idle_cv_.notify_all();
  }
}

}  // namespace bagua
