// A process-wide table of live objects addressed by an integer handle, for
// what a jitted program must name but cannot carry (the XLA FFI handlers
// receive the handle as a static attribute): communicators
// (comm/registry.h), the weights of an asynchronous model average
// (sched/async_weights.h). Handles start at 1 and are never reused.
#pragma once

#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>
#include <utility>

#include "common/error.h"

namespace bagua {

template <typename T>
class HandleTable {
 public:
  // `what` names the kind in errors ("communicator").
  explicit HandleTable(std::string what) : what_(std::move(what)) {}

  int64_t add(std::shared_ptr<T> object) {
    std::lock_guard<std::mutex> lock(mu_);
    const int64_t handle = next_++;
    table_[handle] = std::move(object);
    return handle;
  }

  // Puts `object` under `handle`, one add() gave before (a rebinding: a
  // jitted program naming the handle then reaches the new object).
  void set(int64_t handle, std::shared_ptr<T> object) {
    std::lock_guard<std::mutex> lock(mu_);
    if (handle < 1 || handle >= next_) throw InvalidArgument("no " + what_ + " handle " + std::to_string(handle));
    table_[handle] = std::move(object);
  }

  // Throws InvalidArgument for an unknown handle; `hint` ends the message.
  std::shared_ptr<T> get(int64_t handle, const std::string& hint) const {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = table_.find(handle);
    if (it == table_.end()) throw InvalidArgument("no " + what_ + " with handle " + std::to_string(handle) + hint);
    return it->second;
  }

  void remove(int64_t handle) {
    std::lock_guard<std::mutex> lock(mu_);
    table_.erase(handle);
  }

 private:
  const std::string what_;
  mutable std::mutex mu_;
  std::unordered_map<int64_t, std::shared_ptr<T>> table_;
  int64_t next_ = 1;
};

}  // namespace bagua
