// The TCP store server's keys and values, with the store's rules and quotas:
// keys are written once (a SET of an existing key with another value is
// refused, so a rendezvous cannot be rewritten under its readers; the same
// value again is fine), a value may hold at most max_value_bytes and all keys
// and values together at most max_total_bytes, and ADD keeps a decimal int64
// under its key. Refusals are messages for the client, naming the setting that
// would raise the limit. Not thread-safe: the server thread owns it.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <unordered_map>

namespace bagua {

class StoreTable {
 public:
  StoreTable(size_t max_value_bytes, size_t max_total_bytes)
      : max_value_bytes_(max_value_bytes), max_total_bytes_(max_total_bytes) {}

  struct SetResult {
    bool stored = false;  // a new key: its waiters may wake
    std::string error;    // non-empty: refused, nothing changed
  };
  SetResult set(const std::string& key, std::string value);

  // Adds `delta` to the integer under `key` (0 when absent) into *result.
  // Returns an error message (nothing changed) or "".
  std::string add(const std::string& key, int64_t delta, int64_t* result);

  // The value under `key`, or null.
  const std::string* find(const std::string& key) const;
  bool contains(const std::string& key) const { return data_.count(key) != 0; }

 private:
  const size_t max_value_bytes_;
  const size_t max_total_bytes_;
  std::unordered_map<std::string, std::string> data_;
  size_t stored_bytes_ = 0;  // keys and values held in `data_`
};

}  // namespace bagua
