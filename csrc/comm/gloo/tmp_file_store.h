// TEMPORARY until the TCP store lands: a bagua::Store over Gloo's FileStore,
// for tests only (keys are write-once: use a fresh directory per run).
#pragma once

#include <chrono>
#include <string>
#include <vector>

#include <gloo/rendezvous/file_store.h>

#include "common/error.h"
#include "store/store.h"

namespace bagua {

class TmpFileStore : public Store {
 public:
  explicit TmpFileStore(const std::string& path) : fs_(path) {}

  void set(const std::string& key, const std::vector<uint8_t>& value) override {
    fs_.set(key, std::vector<char>(value.begin(), value.end()));
  }
  std::vector<uint8_t> get(const std::string& key, std::chrono::milliseconds timeout) override {
    wait({key}, timeout);
    auto v = fs_.get(key);
    return std::vector<uint8_t>(v.begin(), v.end());
  }
  int64_t add(const std::string&, int64_t) override { throw Error("TmpFileStore: add unsupported"); }
  void wait(const std::vector<std::string>& keys, std::chrono::milliseconds timeout) override {
    try {
      fs_.wait(keys, timeout);
    } catch (const std::exception& e) {
      throw TimeoutError(e.what());
    }
  }
  bool check(const std::vector<std::string>& keys) override {
    try {
      fs_.wait(keys, std::chrono::milliseconds(1));
      return true;
    } catch (const std::exception&) {
      return false;
    }
  }
  std::chrono::milliseconds timeout() const override { return std::chrono::milliseconds(30000); }

 private:
  gloo::rendezvous::FileStore fs_;
};

}  // namespace bagua
