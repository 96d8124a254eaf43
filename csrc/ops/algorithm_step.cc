#include "ops/algorithm_step.h"

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdlib>

#include "bucket/host_memory.h"
#include "common/error.h"

namespace bagua {

void* GrowOnlyScratch::get(int slot, size_t nbytes) {
  if (slot < 0) throw InvalidArgument("scratch slot must be >= 0");
  const size_t i = static_cast<size_t>(slot);
  if (memory_.size() <= i) {
    memory_.resize(i + 1);
    sizes_.resize(i + 1, 0);
  }
  if (!memory_[i] || sizes_[i] < nbytes) {
    memory_[i] = device_ ? device_->allocate(nbytes) : allocate_host_memory(nbytes);
    sizes_[i] = nbytes;
  }
  return memory_[i].get();
}

std::vector<Span> state_spans(void* block, int n, size_t count, DType dtype) {
  std::vector<Span> out;
  for (int k = 0; k < n; ++k)
    out.push_back(Span{static_cast<char*>(block) + k * count * dtype_size(dtype), count, dtype});
  return out;
}

void Step::check(DType dtype, size_t count) const {
  if (count % alignment() != 0)
    throw InvalidArgument(describe() + ": " + std::to_string(count) + " elements, not a multiple of " +
                          std::to_string(alignment()) + " (pad the buffer to a multiple of the chunk count)");
}

namespace {

StepParams::Value parse_value(const std::string& text) {
  if (text == "true") return true;
  if (text == "false") return false;
  if (!text.empty()) {
    errno = 0;
    char* end = nullptr;
    const long long v = std::strtoll(text.c_str(), &end, 10);
    if (errno == 0 && end && *end == '\0') return static_cast<int64_t>(v);
  }
  return text;
}

std::string value_text(const StepParams::Value& v) {
  if (auto b = std::get_if<bool>(&v)) return *b ? "true" : "false";
  if (auto i = std::get_if<int64_t>(&v)) return std::to_string(*i);
  return std::get<std::string>(v);
}

const char* type_name(const StepParams::Value& v) {
  if (std::holds_alternative<bool>(v)) return "a bool";
  if (std::holds_alternative<int64_t>(v)) return "an int";
  return "a string";
}

}  // namespace

StepParams StepParams::parse(const std::string& text) {
  StepParams p;
  size_t start = 0;
  while (start < text.size()) {
    size_t end = text.find(';', start);
    if (end == std::string::npos) end = text.size();
    const std::string item = text.substr(start, end - start);
    if (!item.empty()) {
      const size_t eq = item.find('=');
      if (eq == std::string::npos || eq == 0)
        throw InvalidArgument("step parameters: expected key=value, got '" + item + "'");
      p.values_[item.substr(0, eq)] = parse_value(item.substr(eq + 1));
    }
    start = end + 1;
  }
  return p;
}

std::string StepParams::to_string() const {
  std::string out;
  for (const auto& [k, v] : values_) {
    if (!out.empty()) out += ";";
    out += k + "=" + value_text(v);
  }
  return out;
}

bool StepParams::get_bool(const std::string& step, const std::string& key, bool fallback) const {
  auto it = values_.find(key);
  if (it == values_.end()) return fallback;
  if (auto b = std::get_if<bool>(&it->second)) return *b;
  throw InvalidArgument(step + ": " + key + " must be a bool, got " + type_name(it->second) + " (" +
                        value_text(it->second) + ")");
}

int64_t StepParams::get_int(const std::string& step, const std::string& key, int64_t fallback) const {
  auto it = values_.find(key);
  if (it == values_.end()) return fallback;
  if (auto i = std::get_if<int64_t>(&it->second)) return *i;
  throw InvalidArgument(step + ": " + key + " must be an int, got " + type_name(it->second) + " (" +
                        value_text(it->second) + ")");
}

std::string StepParams::get_string(const std::string& step, const std::string& key, const std::string& fallback) const {
  auto it = values_.find(key);
  if (it == values_.end()) return fallback;
  if (auto s = std::get_if<std::string>(&it->second)) return *s;
  throw InvalidArgument(step + ": " + key + " must be a string, got " + type_name(it->second) + " (" +
                        value_text(it->second) + ")");
}

double StepParams::get_double(const std::string& step, const std::string& key, double fallback) const {
  auto it = values_.find(key);
  if (it == values_.end()) return fallback;
  if (auto i = std::get_if<int64_t>(&it->second)) return static_cast<double>(*i);
  if (auto s = std::get_if<std::string>(&it->second)) {
    char* end = nullptr;
    errno = 0;
    const double v = std::strtod(s->c_str(), &end);
    if (!s->empty() && *end == '\0' && errno == 0 && std::isfinite(v)) return v;
  }
  throw InvalidArgument(step + ": " + key + " must be a finite number, got " + type_name(it->second) + " (" +
                        value_text(it->second) + ")");
}

void StepParams::check_known(const std::string& step, const std::vector<std::string>& keys) const {
  for (const auto& [k, v] : values_) {
    if (std::find(keys.begin(), keys.end(), k) == keys.end()) {
      std::string known;
      for (const auto& key : keys) known += (known.empty() ? "" : ", ") + key;
      throw InvalidArgument(step + ": unknown parameter '" + k + "' (known: " + known + ")");
    }
  }
}

}  // namespace bagua
