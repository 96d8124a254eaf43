#include "store/tcp_store_table.h"

#include <cerrno>
#include <cstdlib>

namespace bagua {

StoreTable::SetResult StoreTable::set(const std::string& key, std::string value) {
  auto it = data_.find(key);
  if (it != data_.end()) {
    // Written once: a rendezvous cannot be rewritten under its readers.
    if (it->second == value) return {};
    return {false, "set: key '" + key + "' is already set (store keys are written once)"};
  }
  if (value.size() > max_value_bytes_) {
    return {false, "set: a value of " + std::to_string(value.size()) + " bytes exceeds the store's limit of " +
                       std::to_string(max_value_bytes_) + " (BAGUA_STORE_MAX_VALUE_BYTES)"};
  }
  if (stored_bytes_ + key.size() + value.size() > max_total_bytes_) {
    return {false, "set: the store holds " + std::to_string(stored_bytes_) + " bytes; key '" + key +
                       "' would exceed its limit of " + std::to_string(max_total_bytes_) + " (BAGUA_STORE_MAX_BYTES)"};
  }
  stored_bytes_ += key.size() + value.size();
  data_.emplace(key, std::move(value));
  return {true, {}};
}

std::string StoreTable::add(const std::string& key, int64_t delta, int64_t* result) {
  int64_t value = 0;
  auto it = data_.find(key);
  if (it != data_.end()) {
    const std::string& s = it->second;
    errno = 0;
    char* end = nullptr;
    long long v = s.empty() ? 0 : std::strtoll(s.c_str(), &end, 10);
    if (s.empty() || errno != 0 || end != s.c_str() + s.size() || s.find('\0') != std::string::npos)
      return "add: the value of key '" + key + "' is not an integer";
    value = v;
  }
  if (__builtin_add_overflow(value, delta, result)) return "add: key '" + key + "' would overflow int64";
  std::string text = std::to_string(*result);
  const size_t before = it == data_.end() ? 0 : key.size() + it->second.size();
  if (stored_bytes_ - before + key.size() + text.size() > max_total_bytes_)
    return "add: the store is full (BAGUA_STORE_MAX_BYTES=" + std::to_string(max_total_bytes_) + ")";
  stored_bytes_ = stored_bytes_ - before + key.size() + text.size();
  data_[key] = std::move(text);
  return "";
}

const std::string* StoreTable::find(const std::string& key) const {
  auto it = data_.find(key);
  return it == data_.end() ? nullptr : &it->second;
}

}  // namespace bagua
