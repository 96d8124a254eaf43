// Float32 SUM/AVG allreduce whose messages may travel top-byte packed
// (kernels/top_byte_pack.h): fewer bytes on a slow link, the same bits.
//
// Reduce-scatter then allgather by direct exchange on Gloo unbound buffers,
// every receive posted up front and every send posted as soon as its bytes
// are ready, so both directions of each link carry data at once. Chunk r
// (elements [count*r/size, count*(r+1)/size)) belongs to rank r, which sums
// it over the ranks in rank order, ((x0 + x1) + x2) + ..., divides by size
// for AVG (cpu_average), and sends the result to every peer. For 2 ranks this
// is bitwise what Gloo's ring gives (a + b == b + a); for more ranks the sum
// is in rank order, where Gloo's ring adds in ring order.
//
// Chunks travel in segments of `segment_elems` values: a helper thread packs
// segment k+1 of the reduce-scatter while segment k is on the wire, and
// segment k is summed and unpacked while later ones arrive. Every segment is
// two messages: a 16-byte header (format raw or packed, body size) and the
// body. The sender decides per message (`pack`, and never when packing would
// not shrink the segment); receivers post each body at its raw size (Gloo's
// TCP pair accepts a shorter message into a larger posted receive) and read
// the format from the header, so ranks need not agree on packing.
//
// A call longer than `window_elems` values (0: no limit) runs as windows of
// that many, one exchange after the other, so the scratch it keeps (the
// staged bodies: about 2 + 1/size times what one exchange carries) is
// bounded by the window, not by the largest buffer ever reduced. Each window
// ends with its last segment's allgather before the next begins: the cost is
// one segment's round trip per window.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

#include <gloo/context.h>

namespace bagua {
namespace gloo_algorithms {

constexpr uint8_t kPackedAllreduceSlotPrefix = 0x45;

struct PackedAllreduceStats {
  size_t packed_messages = 0;  // bodies sent packed
  size_t raw_messages = 0;     // bodies sent as they are
  size_t wire_bytes = 0;       // headers and bodies this rank sent
  size_t raw_bytes = 0;        // bodies this rank would have sent unpacked
  size_t received_bytes = 0;   // headers and bodies this rank received
  // From the first received header to the end of the call: the link's rate
  // without the wait for a late peer (received_bytes / receiving_seconds).
  double receiving_seconds = 0;
};

// Sums over every packed_allreduce_f32 call of this process (packed_messages,
// raw_messages, wire_bytes, raw_bytes, received_bytes), for benchmarks and tests.
PackedAllreduceStats packed_allreduce_totals();

// Memory kept between calls (growing only), so large calls do not fault pages in each time.
struct PackedAllreduceScratch {
  std::vector<uint8_t> rs_out, rs_in, ag_out, ag_stage;
  std::vector<float> acc;
};

// recv may equal send (in place); otherwise they must not overlap. `slot`
// comes from make_slot(kPackedAllreduceSlotPrefix, tag).
PackedAllreduceStats packed_allreduce_f32(const std::shared_ptr<gloo::Context>& ctx, const float* send, float* recv,
                                          size_t count, bool average, bool pack, uint64_t slot,
                                          std::chrono::milliseconds timeout, size_t segment_elems, size_t window_elems,
                                          PackedAllreduceScratch& scratch);

}  // namespace gloo_algorithms
}  // namespace bagua
