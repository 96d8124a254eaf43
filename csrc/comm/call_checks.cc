#include "comm/call_checks.h"

#include <algorithm>
#include <cstdint>
#include <utility>

#include "common/error.h"
#include "kernels/scale.h"  // is_integer_dtype

namespace bagua {

void CallChecks::invalid(const std::string& why) const {
  throw InvalidArgument(comm_.describe() + ": " + op_kind_name(call_.kind) + ": " + why);
}

const CallChecks& CallChecks::dtype() const {
  if (!is_valid_dtype(static_cast<int>(call_.dtype)))
    invalid("unknown dtype " + std::to_string(static_cast<int>(call_.dtype)));
  if (!call_.has_reduce_op()) return *this;
  if (!is_valid_reduce_op(static_cast<int>(call_.op)))
    invalid("unknown reduce op " + std::to_string(static_cast<int>(call_.op)));
  if (is_bitwise(call_.op) && !is_integer_dtype(call_.dtype))
    invalid(std::string(reduce_op_name(call_.op)) + " needs an integer dtype (int32, int64, uint8), got " +
            dtype_name(call_.dtype));
  return *this;
}

void CallChecks::in_range(int64_t r, const char* what) const {
  if (r < 0 || r >= comm_.size())
    invalid(std::string(what) + " " + std::to_string(r) + " is out of range [0, " + std::to_string(comm_.size()) + ")");
}

const CallChecks& CallChecks::root() const {
  in_range(call_.root, "root");
  return *this;
}

const CallChecks& CallChecks::peer() const {
  in_range(call_.root, "peer");
  if (call_.root == comm_.rank()) invalid("peer is this rank itself");
  return *this;
}

const CallChecks& CallChecks::buffer(const void* p, size_t count, const char* what) const {
  if (p == nullptr && count > 0)
    invalid(std::string(what) + " pointer is null but holds " + std::to_string(count) + " elements");
  return *this;
}

size_t CallChecks::layout(const void* p, const std::vector<size_t>& counts, const std::vector<size_t>& displs,
                          const char* what) const {
  const std::string w(what);
  const size_t n = static_cast<size_t>(comm_.size());
  if (counts.size() != n || displs.size() != n)
    invalid(w + "_counts and " + w + "_displs need " + std::to_string(n) + " entries (one per rank), got " +
            std::to_string(counts.size()) + " and " + std::to_string(displs.size()));
  constexpr size_t kMax = SIZE_MAX / 16;  // no overflow once scaled to bytes
  size_t end = 0;
  std::vector<std::pair<size_t, size_t>> spans;
  for (size_t i = 0; i < n; ++i) {
    if (counts[i] > kMax || displs[i] > kMax - counts[i])
      invalid(w + "_counts/" + w + "_displs[" + std::to_string(i) + "] are out of range");
    if (counts[i] > 0) {
      spans.emplace_back(displs[i], displs[i] + counts[i]);
      end = std::max(end, displs[i] + counts[i]);
    }
  }
  buffer(p, end, what);
  // Receive regions must not overlap each other, or a receive would clobber another.
  if (w == "recv") {
    std::sort(spans.begin(), spans.end());
    for (size_t i = 1; i < spans.size(); ++i)
      if (spans[i].first < spans[i - 1].second) invalid("recv regions overlap (check recv_displs)");
  }
  return end;
}

}  // namespace bagua
