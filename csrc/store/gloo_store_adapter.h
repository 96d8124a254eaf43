// Lets Gloo rendezvous through a bagua::Store.
//
// Gloo's connectFullMesh calls get() without a wait() first, so get() blocks
// (up to the store's timeout). A key prefix keeps the keys of several
// communicators (process groups) apart in one store.
#pragma once

#include <gloo/rendezvous/store.h>

#include <algorithm>
#include <chrono>
#include <string>
#include <vector>

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
    std::vector<uint8_t> v = store_->get(full(key), store_->timeout());
    return std::vector<char>(v.begin(), v.end());
  }

  void wait(const std::vector<std::string>& keys) override { wait(keys, store_->timeout()); }

  void wait(const std::vector<std::string>& keys, const std::chrono::milliseconds& timeout) override {
    std::vector<std::string> full_keys;
    full_keys.reserve(keys.size());
    for (const auto& k : keys) full_keys.push_back(full(k));
    // Never shorter than the store's timeout: Gloo passes its context
    // timeout, which the communicator shortens for the connect phase.
    store_->wait(full_keys, std::max(timeout, store_->timeout()));
  }

  const StorePtr& store() const { return store_; }
  const std::string& prefix() const { return prefix_; }

 private:
  std::string full(const std::string& key) const { return prefix_.empty() ? key : prefix_ + "/" + key; }

  StorePtr store_;
  std::string prefix_;
};

}  // namespace bagua
