// TEMPORARY until csrc/store/gloo_store_adapter.h lands: presents a
// bagua::Store under a key prefix as Gloo's rendezvous store.
#pragma once

#include <chrono>
#include <string>
#include <vector>

#include <gloo/rendezvous/store.h>

#include "store/store.h"

namespace bagua {

class TmpGlooStoreAdapter : public gloo::rendezvous::Store {
 public:
  TmpGlooStoreAdapter(StorePtr store, std::string prefix, std::chrono::milliseconds timeout)
      : store_(std::move(store)), prefix_(std::move(prefix)), timeout_(timeout) {}

  void set(const std::string& key, const std::vector<char>& data) override {
    store_->set(prefix_ + key, std::vector<uint8_t>(data.begin(), data.end()));
  }
  std::vector<char> get(const std::string& key) override {
    auto v = store_->get(prefix_ + key, timeout_);
    return std::vector<char>(v.begin(), v.end());
  }
  void wait(const std::vector<std::string>& keys) override { wait(keys, timeout_); }
  void wait(const std::vector<std::string>& keys,
            const std::chrono::milliseconds& timeout) override {
    std::vector<std::string> full;
    for (const auto& k : keys) full.push_back(prefix_ + k);
    store_->wait(full, timeout);
  }

 private:
  StorePtr store_;
  std::string prefix_;
  std::chrono::milliseconds timeout_;
};

}  // namespace bagua
