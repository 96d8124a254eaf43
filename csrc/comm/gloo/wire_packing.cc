#include "comm/gloo/wire_packing.h"

#include <algorithm>

#include "common/error.h"

namespace bagua {

// Every rank must run the same allreduce algorithm: BAGUA_WIRE_PACKING set
// differently on different hosts would pair the packed exchange with Gloo's
// ring, which only the timeout would end. Compared once, at creation.
void agree_on_wire_packing(Store& store, const std::string& prefix, int rank, int size, WirePacking mine_setting,
                           std::chrono::milliseconds timeout, const std::string& who) {
  const std::string mine = wire_packing_name(mine_setting);
  const std::string key = prefix + "/wire_packing/";
  store.set(key + std::to_string(rank), std::vector<uint8_t>(mine.begin(), mine.end()));
  std::string all;
  bool differ = false;
  for (int q = 0; q < size; ++q) {
    const std::vector<uint8_t> v = store.get(key + std::to_string(q), timeout);
    const std::string theirs(v.begin(), v.end());
    differ |= theirs != mine;
    all += (q ? ", " : "") + std::string("rank ") + std::to_string(q) + " '" + theirs + "'";
  }
  if (differ)
    throw MismatchError(who + ": BAGUA_WIRE_PACKING differs across the group (" + all +
                        "); set the same value on every rank");
}

WirePackingPolicy::WirePackingPolicy(const GlooCommunicatorOptions& options)
    : mode_(options.wire_packing),
      min_bytes_(options.wire_packing_min_bytes),
      slow_bits_per_s_(options.wire_packing_slow_bits_per_s) {}

bool WirePackingPolicy::packable(DType dtype, ReduceOp op, size_t bytes) const {
  return dtype == DType::kFloat32 && (op == ReduceOp::kSum || op == ReduceOp::kAvg) && bytes >= min_bytes_;
}

bool WirePackingPolicy::takes_packed_path(DType dtype, ReduceOp op, size_t bytes,
                                          const std::function<std::vector<int64_t>(int64_t)>& vote) {
  if (mode_ == WirePacking::kOff || !packable(dtype, op, bytes)) return false;
  if (mode_ == WirePacking::kOn) return true;
  const uint64_t call = packable_calls_++;
  if (call == kFirstVote || (call > kFirstVote && (call - kFirstVote) % kVoteEvery == 0)) {
    const int64_t mine = best_bits_per_s_ > 0 && best_bits_per_s_ < slow_bits_per_s_;
    const std::vector<int64_t> all = vote(mine);
    packed_path_ = std::all_of(all.begin(), all.end(), [](int64_t v) { return v == 1; });
    best_bits_per_s_ = 0;
  }
  return packed_path_;
}

bool WirePackingPolicy::senders_pack() const {
  return mode_ == WirePacking::kOn || (link_bits_per_s_ > 0 && link_bits_per_s_ < slow_bits_per_s_);
}

void WirePackingPolicy::note_link_rate(double bytes, double seconds) {
  if (seconds <= 0) return;
  link_bits_per_s_ = 8.0 * bytes / seconds;
  best_bits_per_s_ = std::max(best_bits_per_s_, link_bits_per_s_);
}

}  // namespace bagua
