#include "bucket/plan.h"

#include <algorithm>
#include <map>
#include <unordered_set>

#include "common/error.h"

namespace bagua {

std::vector<std::vector<size_t>> plan_buckets(const std::vector<TensorDecl>& tensors, size_t bucket_bytes) {
  if (bucket_bytes == 0) throw InvalidArgument("bucket size must be at least 1 byte");
  std::unordered_set<std::string> names;
  for (const auto& t : tensors) {
    if (!is_valid_dtype(static_cast<int>(t.dtype)))
      throw InvalidArgument("tensor '" + t.name + "' has an unknown dtype");
    if (!names.insert(t.name).second) throw InvalidArgument("tensor '" + t.name + "' is declared twice");
  }

  struct Open {
    std::vector<size_t> members;
    size_t bytes = 0;
  };
  std::map<DType, Open> open;  // one open bucket per dtype
  // (position of last member, members): sorted at the end.
  std::vector<std::pair<size_t, std::vector<size_t>>> closed;
  auto close = [&](Open& b) {
    if (b.members.empty()) return;
    closed.emplace_back(b.members.back(), std::move(b.members));
    b = Open{};
  };

  for (size_t i = 0; i < tensors.size(); ++i) {
    const size_t bytes = tensors[i].numel * dtype_size(tensors[i].dtype);
    Open& b = open[tensors[i].dtype];
    if (!b.members.empty() && b.bytes + bytes > bucket_bytes) close(b);
    b.members.push_back(i);
    b.bytes += bytes;
    if (b.bytes >= bucket_bytes) close(b);
  }
  for (auto& kv : open) close(kv.second);

  std::sort(closed.begin(), closed.end(), [](const auto& a, const auto& b) { return a.first < b.first; });
  std::vector<std::vector<size_t>> plan;
  plan.reserve(closed.size());
  for (auto& c : closed) plan.push_back(std::move(c.second));
  return plan;
}

}  // namespace bagua
