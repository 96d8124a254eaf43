#include "comm/gloo/packed_allreduce.h"

#include <gloo/common/error.h>
#include <gloo/transport/unbound_buffer.h>

#include <algorithm>
#include <cstring>
#include <future>
#include <mutex>
#include <string>

#include "common/dtype.h"
#include "common/error.h"
#include "kernels/reduce.h"
#include "kernels/top_byte_pack.h"

namespace bagua {
namespace gloo_algorithms {
namespace {

using gloo::transport::UnboundBuffer;
using UB = std::unique_ptr<UnboundBuffer>;

enum Format : uint32_t { kRaw = 0x52415731u /* "1WAR" */, kPacked = 0x4b435031u /* "1PCK" */ };

struct WireHeader {
  uint32_t format;
  uint32_t reserved;
  uint64_t body_bytes;
};
static_assert(sizeof(WireHeader) == 16, "the header is 16 bytes on the wire");

// Sub-streams of one call: which message of segment j.
enum Kind : uint32_t { kRsHeader = 0, kRsBody = 1, kAgHeader = 2, kAgBody = 3 };
constexpr size_t kMaxSegments = size_t{1} << 21;
uint64_t sub_slot(uint64_t slot, Kind kind, size_t j) { return slot | (static_cast<uint64_t>(kind) << 21) | j; }

void wait_recv(UnboundBuffer& b, std::chrono::milliseconds timeout) {
  if (!b.waitRecv(timeout)) throw gloo::IoException("receive aborted");
}
void wait_send(UnboundBuffer& b, std::chrono::milliseconds timeout) {
  if (!b.waitSend(timeout)) throw gloo::IoException("send aborted");
}

// Which bytes a segment of `n` values sends: packed into `stage` when asked
// and smaller, else the values themselves. Fills the header and the stats.
struct Body {
  bool packed;
  size_t bytes;
};
Body prepare(const float* values, size_t n, bool pack, uint8_t* stage, WireHeader& h) {
  size_t bytes = pack && n > 0 ? top_byte_pack(reinterpret_cast<const uint32_t*>(values), n, stage, 4 * n) : 0;
  const bool packed = bytes > 0;
  if (!packed) bytes = 4 * n;
  h = WireHeader{packed ? kPacked : kRaw, 0, bytes};
  return Body{packed, bytes};
}

void count_sent(PackedAllreduceStats& st, const Body& b, size_t n, size_t peers) {
  (b.packed ? st.packed_messages : st.raw_messages) += peers;
  st.wire_bytes += peers * (sizeof(WireHeader) + b.bytes);
  st.raw_bytes += peers * 4 * n;
}

void check_header(const WireHeader& h, size_t n, int from) {
  const bool ok = (h.format == kRaw && h.body_bytes == 4 * n) ||
                  (h.format == kPacked && h.body_bytes < 4 * n && h.body_bytes >= top_byte_packed_size(n, 0));
  if (!ok)
    throw Error("packed allreduce: rank " + std::to_string(from) + " sent a segment header (format " +
                std::to_string(h.format) + ", " + std::to_string(h.body_bytes) + " bytes) that does not fit " +
                std::to_string(n) + " float32 values");
}

std::mutex totals_mu;
PackedAllreduceStats totals;

void add_to_totals(const PackedAllreduceStats& s) {
  std::lock_guard<std::mutex> g(totals_mu);
  totals.packed_messages += s.packed_messages;
  totals.raw_messages += s.raw_messages;
  totals.wire_bytes += s.wire_bytes;
  totals.raw_bytes += s.raw_bytes;
  totals.received_bytes += s.received_bytes;
}

}  // namespace

// One window of the call: the whole exchange of `count` values.
static PackedAllreduceStats exchange(const std::shared_ptr<gloo::Context>& ctx, const float* send, float* recv,
                                     size_t count, bool average, bool pack, uint64_t slot,
                                     std::chrono::milliseconds timeout, size_t segment_elems,
                                     PackedAllreduceScratch& scratch) {
  const int size = ctx->size;
  const int me = ctx->rank;
  const size_t S = std::max<size_t>(1, segment_elems);
  auto chunk_begin = [&](int c) { return count * static_cast<size_t>(c) / static_cast<size_t>(size); };
  const size_t max_chunk = (count + size - 1) / size;
  const size_t segs = std::max<size_t>(1, (max_chunk + S - 1) / S);
  if (segs >= kMaxSegments) throw InvalidArgument("packed allreduce: too many segments");
  // Segment j of chunk c: [seg_begin, seg_begin + seg_len), possibly empty.
  auto seg_begin = [&](int c, size_t j) { return std::min(chunk_begin(c + 1), chunk_begin(c) + j * S); };
  auto seg_len = [&](int c, size_t j) {
    return std::min(chunk_begin(c + 1), chunk_begin(c) + (j + 1) * S) - seg_begin(c, j);
  };
  auto stage_at = [&](std::vector<uint8_t>& v, size_t index) { return v.data() + index * 4 * S; };

  scratch.rs_out.resize(static_cast<size_t>(size) * segs * 4 * S);
  scratch.rs_in.resize(static_cast<size_t>(size) * segs * 4 * S);
  scratch.ag_out.resize(segs * 4 * S);
  scratch.ag_stage.resize(4 * S);
  scratch.acc.resize(S);
  std::vector<WireHeader> rs_out_h(size * segs), rs_in_h(size * segs), ag_out_h(segs), ag_in_h(size * segs);

  // Receives: one buffer per message, so each wait is for that message.
  std::vector<UB> rs_in_hb(size * segs), rs_in_bb(size * segs), ag_in_hb(size * segs), ag_in_bb(size * segs);
  for (size_t j = 0; j < segs; ++j) {
    for (int p = 0; p < size; ++p) {
      if (p == me) continue;
      const size_t k = p * segs + j;
      rs_in_hb[k] = ctx->createUnboundBuffer(&rs_in_h[k], sizeof(WireHeader));
      rs_in_hb[k]->recv(p, sub_slot(slot, kRsHeader, j));
      ag_in_hb[k] = ctx->createUnboundBuffer(&ag_in_h[k], sizeof(WireHeader));
      ag_in_hb[k]->recv(p, sub_slot(slot, kAgHeader, j));
      if (const size_t n = seg_len(me, j)) {
        rs_in_bb[k] = ctx->createUnboundBuffer(stage_at(scratch.rs_in, k), 4 * n);
        rs_in_bb[k]->recv(p, sub_slot(slot, kRsBody, j));
      }
      if (const size_t n = seg_len(p, j)) {
        ag_in_bb[k] = ctx->createUnboundBuffer(recv + seg_begin(p, j), 4 * n);
        ag_in_bb[k]->recv(p, sub_slot(slot, kAgBody, j));
      }
    }
  }

  // Send-side buffers; their sends are counted and waited for at the end.
  UB user_in = ctx->createUnboundBuffer(const_cast<float*>(send), std::max<size_t>(1, count) * 4);
  UB rs_out_b = ctx->createUnboundBuffer(scratch.rs_out.data(), scratch.rs_out.size());
  UB rs_out_hb = ctx->createUnboundBuffer(rs_out_h.data(), rs_out_h.size() * sizeof(WireHeader));
  UB ag_out_b = ctx->createUnboundBuffer(scratch.ag_out.data(), scratch.ag_out.size());
  UB ag_out_hb = ctx->createUnboundBuffer(ag_out_h.data(), ag_out_h.size() * sizeof(WireHeader));
  UB mine_out = ctx->createUnboundBuffer(recv, std::max<size_t>(1, count) * 4);  // my reduced chunk, raw
  size_t rs_body_sends = 0, rs_user_sends = 0, ag_body_sends = 0, ag_raw_sends = 0;

  PackedAllreduceStats rs_stats, ag_stats;
  // Reduce-scatter sends: pack segment j for every peer, post it, go on (the
  // transport thread writes it out while the next one is packed).
  auto rs_sender = [&] {
    for (size_t j = 0; j < segs; ++j) {
      for (int i = 1; i < size; ++i) {
        const int c = (me + i) % size;
        const size_t k = c * segs + j, n = seg_len(c, j);
        const Body b = prepare(send + seg_begin(c, j), n, pack, stage_at(scratch.rs_out, k), rs_out_h[k]);
        count_sent(rs_stats, b, n, 1);
        rs_out_hb->send(c, sub_slot(slot, kRsHeader, j), k * sizeof(WireHeader), sizeof(WireHeader));
        if (n == 0) continue;
        if (b.packed) {
          rs_out_b->send(c, sub_slot(slot, kRsBody, j), k * 4 * S, b.bytes);
          ++rs_body_sends;
        } else {
          user_in->send(c, sub_slot(slot, kRsBody, j), seg_begin(c, j) * 4, b.bytes);
          ++rs_user_sends;
        }
      }
    }
  };
  // Destroyed (joined) before the buffers it uses.
  std::future<void> helper = std::async(std::launch::async, rs_sender);

  // My chunk: sum segment j over the ranks in rank order, then send it to everyone.
  float* acc = scratch.acc.data();
  size_t received = 0;
  std::chrono::steady_clock::time_point first_arrival;
  for (size_t j = 0; j < segs; ++j) {
    const size_t n = seg_len(me, j), b0 = seg_begin(me, j);
    for (int p = 0; p < size; ++p) {
      const float* own = send + b0;
      const size_t k = p * segs + j;
      if (p != me) {
        wait_recv(*rs_in_hb[k], timeout);
        if (received == 0) first_arrival = std::chrono::steady_clock::now();
        check_header(rs_in_h[k], n, p);
        received += sizeof(WireHeader) + rs_in_h[k].body_bytes;
        if (n > 0) wait_recv(*rs_in_bb[k], timeout);
      }
      if (n == 0) continue;
      const uint8_t* body = stage_at(scratch.rs_in, k);
      const bool packed = p != me && rs_in_h[k].format == kPacked;
      if (p == 0) {
        if (packed) {
          top_byte_unpack(body, rs_in_h[k].body_bytes, n, reinterpret_cast<uint32_t*>(acc));
        } else {
          std::memcpy(acc, p == me ? static_cast<const void*>(own) : body, 4 * n);
        }
      } else if (packed) {
        top_byte_unpack_add(body, rs_in_h[k].body_bytes, n, acc);
      } else {
        const float* x = p == me ? own : reinterpret_cast<const float*>(body);
        for (size_t i = 0; i < n; ++i) acc[i] = acc[i] + x[i];
      }
    }
    if (n > 0) {
      if (average) cpu_average(acc, n, DType::kFloat32, size);
      std::memcpy(recv + b0, acc, 4 * n);
    }
    const Body b = prepare(recv + b0, n, pack, stage_at(scratch.ag_out, j), ag_out_h[j]);
    count_sent(ag_stats, b, n, size - 1);
    for (int i = 1; i < size; ++i) {
      const int to = (me + i) % size;
      ag_out_hb->send(to, sub_slot(slot, kAgHeader, j), j * sizeof(WireHeader), sizeof(WireHeader));
      if (n == 0) continue;
      if (b.packed) {
        ag_out_b->send(to, sub_slot(slot, kAgBody, j), j * 4 * S, b.bytes);
        ++ag_body_sends;
      } else {
        mine_out->send(to, sub_slot(slot, kAgBody, j), b0 * 4, b.bytes);
        ++ag_raw_sends;
      }
    }
  }

  // The other chunks: raw bodies landed in place; packed ones are unpacked.
  for (size_t j = 0; j < segs; ++j) {
    for (int i = 1; i < size; ++i) {
      const int p = (me + size - i) % size;
      const size_t k = p * segs + j, n = seg_len(p, j);
      wait_recv(*ag_in_hb[k], timeout);
      check_header(ag_in_h[k], n, p);
      received += sizeof(WireHeader) + ag_in_h[k].body_bytes;
      if (n == 0) continue;
      wait_recv(*ag_in_bb[k], timeout);
      if (ag_in_h[k].format == kPacked) {
        float* out = recv + seg_begin(p, j);
        const size_t bytes = ag_in_h[k].body_bytes;
        std::memcpy(scratch.ag_stage.data(), out, bytes);
        top_byte_unpack(scratch.ag_stage.data(), bytes, n, reinterpret_cast<uint32_t*>(out));
      }
    }
  }

  helper.get();
  for (size_t i = 0; i < rs_body_sends; ++i) wait_send(*rs_out_b, timeout);
  for (size_t i = 0; i < rs_user_sends; ++i) wait_send(*user_in, timeout);
  for (size_t i = 0; i < static_cast<size_t>(size - 1) * segs; ++i) wait_send(*rs_out_hb, timeout);
  for (size_t i = 0; i < static_cast<size_t>(size - 1) * segs; ++i) wait_send(*ag_out_hb, timeout);
  for (size_t i = 0; i < ag_body_sends; ++i) wait_send(*ag_out_b, timeout);
  for (size_t i = 0; i < ag_raw_sends; ++i) wait_send(*mine_out, timeout);

  PackedAllreduceStats st = rs_stats;
  st.packed_messages += ag_stats.packed_messages;
  st.raw_messages += ag_stats.raw_messages;
  st.wire_bytes += ag_stats.wire_bytes;
  st.raw_bytes += ag_stats.raw_bytes;
  st.received_bytes = received;
  st.receiving_seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - first_arrival).count();
  add_to_totals(st);
  return st;
}

PackedAllreduceStats packed_allreduce_totals() {
  std::lock_guard<std::mutex> g(totals_mu);
  return totals;
}

PackedAllreduceStats packed_allreduce_f32(const std::shared_ptr<gloo::Context>& ctx, const float* send, float* recv,
                                          size_t count, bool average, bool pack, uint64_t slot,
                                          std::chrono::milliseconds timeout, size_t segment_elems, size_t window_elems,
                                          PackedAllreduceScratch& scratch) {
  // At least one segment per rank's chunk in a window; windows of one call
  // reuse its slot: each pair delivers a slot's messages in order, so a
  // peer's next window never meets this one's receives.
  const size_t per_window =
      window_elems == 0 ? count
                        : std::max(window_elems, std::max<size_t>(1, segment_elems) * static_cast<size_t>(ctx->size));
  PackedAllreduceStats total;
  size_t begin = 0;
  do {
    const size_t n = std::min(per_window, count - begin);
    const PackedAllreduceStats st =
        exchange(ctx, send + begin, recv + begin, n, average, pack, slot, timeout, segment_elems, scratch);
    total.packed_messages += st.packed_messages;
    total.raw_messages += st.raw_messages;
    total.wire_bytes += st.wire_bytes;
    total.raw_bytes += st.raw_bytes;
    total.received_bytes += st.received_bytes;
    total.receiving_seconds += st.receiving_seconds;
    begin += n;
  } while (begin < count);
  return total;
}

}  // namespace gloo_algorithms
}  // namespace bagua
