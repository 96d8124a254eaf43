// Rendezvous key-value store used to bootstrap communicators (Gloo addresses,
// NCCL unique ids). Values are opaque bytes. Every blocking call takes a timeout
// and throws bagua::TimeoutError when it expires.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace bagua {

class Store {
 public:
  virtual ~Store() = default;

  virtual void set(const std::string& key, const std::vector<uint8_t>& value) = 0;
  // Blocks until the key exists.
  virtual std::vector<uint8_t> get(const std::string& key, std::chrono::milliseconds timeout) = 0;
  // Atomically adds delta to an integer counter (created at 0) and returns the new value.
  virtual int64_t add(const std::string& key, int64_t delta) = 0;
  // Blocks until every key exists.
  virtual void wait(const std::vector<std::string>& keys, std::chrono::milliseconds timeout) = 0;
  virtual bool check(const std::vector<std::string>& keys) = 0;

  virtual std::chrono::milliseconds timeout() const = 0;

  // Ranks known to have died: their store connection closed without a clean
  // goodbye. Best effort, used to name the culprit in error messages.
  // Throws bagua::Error if the store itself is unreachable.
  virtual std::vector<int> dead_ranks() { return {}; }
};

using StorePtr = std::shared_ptr<Store>;

}  // namespace bagua
