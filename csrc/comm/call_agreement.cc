#include "comm/call_agreement.h"

namespace bagua {
namespace {

constexpr int64_t kMagic = 0x4241475541444331;  // "BAGUADC1"

// Do two collective calls agree on everything the ranks must agree on?
bool same_call(const OpDesc& a, const OpDesc& b) {
  if (a.kind != b.kind) return false;
  if (a.has_dtype() && a.dtype != b.dtype) return false;
  // alltoall_v counts legitimately differ per rank (checked separately).
  if (a.has_dtype() && a.kind != OpKind::kAlltoallV && a.count != b.count) return false;
  if (a.has_reduce_op() && a.op != b.op) return false;
  if (a.has_root() && a.root != b.root) return false;
  return true;
}

std::string rank_str(int r) { return "rank " + std::to_string(r); }

}  // namespace

DecodedCall decode_call(const int64_t* w) {
  DecodedCall r{w[0] == kMagic, {}, w[2], {w[7], w[8]}};
  r.desc.kind = static_cast<OpKind>(w[1]);
  r.desc.dtype = static_cast<DType>(w[3]);
  r.desc.count = w[4];
  r.desc.root = w[5];
  r.desc.op = static_cast<ReduceOp>(w[6]);
  return r;
}

CallWire encode_call(const OpDesc& d, uint64_t seq, Announcement next) {
  return {kMagic,
          static_cast<int64_t>(d.kind),
          static_cast<int64_t>(seq),
          static_cast<int64_t>(d.dtype),
          d.count,
          d.root,
          static_cast<int64_t>(d.op),
          next.calls,
          next.hash};
}

bool same_desc(const OpDesc& a, const OpDesc& b) { return encode_call(a, 0) == encode_call(b, 0); }

Announcement announce(const std::vector<OpDesc>& calls) {
  uint64_t h = 1469598103934665603ull;  // FNV-1a over the descriptors' words
  for (const OpDesc& d : calls) {
    const CallWire w = encode_call(d, 0);
    for (size_t i = 1; i < 7; ++i) {
      uint64_t v = static_cast<uint64_t>(w[i]);
      for (int b = 0; b < 8; ++b, v >>= 8) h = (h ^ (v & 0xff)) * 1099511628211ull;
    }
  }
  return {static_cast<int64_t>(calls.size()), static_cast<int64_t>(h)};
}

int64_t common_announcement(const int64_t* all, int size) {
  const DecodedCall ref = decode_call(all);
  for (int r = 1; r < size; ++r) {
    const DecodedCall other = decode_call(all + kCallWords * r);
    if (other.next.calls != ref.next.calls || other.next.hash != ref.next.hash) return 0;
  }
  return ref.next.calls > 0 ? ref.next.calls : 0;
}

std::string call_disagreement(const int64_t* all, int size, int my_rank) {
  const DecodedCall ref = decode_call(all);
  for (int r = 1; r < size; ++r) {
    const DecodedCall other = decode_call(all + kCallWords * r);
    if (!other.valid || !ref.valid)
      return "collective #" + std::to_string(ref.seq) + ": " + rank_str(other.valid ? 0 : r) +
             " sent a malformed call descriptor (ranks are out of step)";
    if (!same_call(other.desc, ref.desc))
      return rank_str(r) + " called " + to_string(other.desc) + " while rank 0 called " + to_string(ref.desc) +
             " (collective #" + std::to_string(ref.seq) + " of rank " + std::to_string(my_rank) + ")";
    if (other.seq != ref.seq)
      return rank_str(r) + " is at collective #" + std::to_string(other.seq) + " while rank 0 is at #" +
             std::to_string(ref.seq) + ", both calling " + to_string(ref.desc);
  }
  return "";
}

std::vector<int64_t> encode_alltoallv_counts(const std::vector<size_t>& send_counts,
                                             const std::vector<size_t>& recv_counts) {
  const size_t n = send_counts.size();
  std::vector<int64_t> mine(2 * n);
  for (size_t i = 0; i < n; ++i) {
    mine[i] = static_cast<int64_t>(send_counts[i]);
    mine[n + i] = i < recv_counts.size() ? static_cast<int64_t>(recv_counts[i]) : -1;
  }
  return mine;
}

std::string alltoallv_disagreement(const int64_t* all, int n) {
  for (int from = 0; from < n; ++from) {
    for (int to = 0; to < n; ++to) {
      const int64_t sent = all[2 * n * from + to];
      const int64_t expected = all[2 * n * to + n + from];
      if (sent != expected)
        return "alltoall_v: rank " + std::to_string(from) + " sends " + std::to_string(sent) + " elements to rank " +
               std::to_string(to) + ", which expects " + std::to_string(expected) + " (recv_counts[" +
               std::to_string(from) + "])";
    }
  }
  return "";
}

}  // namespace bagua
