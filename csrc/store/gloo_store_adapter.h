// Lets Gloo rendezvous through a bagua::Store.
//
// Gloo's connectFullMesh calls get() without a wait() first, so get() blocks
// (up to the store's timeout, or until the store reports a rank dead). A key prefix keeps the keys of several
// communicators (process groups) apart in one store.
#pragma once

#include <gloo/rendezvous/store.h>

#include <algorithm>
#include <chrono>
#include <string>
#include <vector>

#include "common/error.h"
#include "store/store.h"

namespace bagua {

class GlooStoreAdapter : public gloo::rendezvous::Store {
 public:
  explicit GlooStoreAdapter(StorePtr store, std::string prefix = "")
      : store_(std::move(store)), prefix_(std::move(prefix)) {}

  void set(const std::string& key, const std::vector<char>& data) override {
    store_->set(full(key), std::vector<uint8_t>(data.begin(), data.end()));
  }

  std::vector<char> get(const std::string& key) override {
    std::vector<uint8_t> v;
    in_slices(store_->timeout(), "get of key '" + full(key) + "'", {key},
              [&](std::chrono::milliseconds t) { v = store_->get(full(key), t); });
    return std::vector<char>(v.begin(), v.end());
  }

  void wait(const std::vector<std::string>& keys) override { wait(keys, store_->timeout()); }

  void wait(const std::vector<std::string>& keys, const std::chrono::milliseconds& timeout) override {
    std::vector<std::string> full_keys;
    full_keys.reserve(keys.size());
    for (const auto& k : keys) full_keys.push_back(full(k));
    // Never shorter than the store's timeout: Gloo passes its context
    // timeout, which the communicator shortens for the connect phase.
    in_slices(std::max(timeout, store_->timeout()), "wait for " + std::to_string(keys.size()) + " keys", keys,
              [&](std::chrono::milliseconds t) { store_->wait(full_keys, t); });
  }

  const StorePtr& store() const { return store_; }
  const std::string& prefix() const { return prefix_; }

 private:
  std::string full(const std::string& key) const { return prefix_.empty() ? key : prefix_ + "/" + key; }

  // Runs a blocking store call in slices of at most a second and fails fast,
  // with PeerError naming them, once the store reports ranks dead: their keys
  // would never come. On timeout, names the ranks whose keys are still missing.
  template <typename Call>
  void in_slices(std::chrono::milliseconds timeout, const std::string& what, const std::vector<std::string>& keys,
                 Call&& call) {
    using Clock = std::chrono::steady_clock;
    const auto deadline = Clock::now() + timeout;
    for (;;) {
      auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now());
      try {
        return call(std::max(std::chrono::milliseconds(1), std::min(left, std::chrono::milliseconds(1000))));
      } catch (const TimeoutError& e) {
        if (Clock::now() >= deadline) throw TimeoutError(e.what() + missing_ranks_note(keys));
      }
      std::vector<int> dead = store_->dead_ranks();
      if (!dead.empty()) {
        std::string ranks;
        for (int r : dead) ranks += (ranks.empty() ? "" : ", ") + std::to_string(r);
        throw PeerError("rendezvous: store " + what + " cannot complete: rank" + (dead.size() > 1 ? "s " : " ") +
                            ranks + (dead.size() > 1 ? " have" : " has") + " died",
                        dead[0]);
      }
    }
  }

  std::string missing_ranks_note(const std::vector<std::string>& keys) {
    std::string ranks;
    size_t n = 0;
    try {
      for (const auto& k : keys) {
        // Gloo names a rank's keys "<n>" or "rank_<n>".
        const std::string r = k.compare(0, 5, "rank_") == 0 ? k.substr(5) : k;
        if (r.empty() || r.find_first_not_of("0123456789") != std::string::npos) continue;
        if (store_->check({full(k)})) continue;
        ranks += (n++ ? ", " : "") + r;
      }
    } catch (const std::exception&) {
      return "";
    }
    if (n == 0) return "";
    return (n == 1 ? "; group rank " : "; group ranks ") + ranks + " did not come to the rendezvous";
  }

  StorePtr store_;
  std::string prefix_;
};

}  // namespace bagua
