#include "comm/gloo/algorithms.h"

#include <gloo/common/error.h>
#include <gloo/transport/unbound_buffer.h>

#include <algorithm>
#include <cstring>
#include <vector>

namespace bagua {
namespace gloo_algorithms {
namespace {

using gloo::transport::UnboundBuffer;

// waitRecv/waitSend return false only when aborted, which we never do;
// treat it as a broken transport all the same.
void wait_recv(UnboundBuffer& buf, std::chrono::milliseconds timeout) {
  if (!buf.waitRecv(timeout)) throw gloo::IoException("receive aborted");
}
void wait_send(UnboundBuffer& buf, std::chrono::milliseconds timeout) {
  if (!buf.waitSend(timeout)) throw gloo::IoException("send aborted");
}

}  // namespace

void ring_reduce_scatter(const std::shared_ptr<gloo::Context>& ctx, const void* send, void* recv, size_t count,
                         size_t elem_size, ReduceFn reduce, uint64_t slot, std::chrono::milliseconds timeout,
                         size_t max_segment_bytes) {
  const int size = ctx->size;
  const int rank = ctx->rank;
  const int right = (rank + 1) % size;
  const int left = (rank + size - 1) % size;
  const size_t chunk = count * elem_size;

  // At least two segments per chunk: segment j of step s is received while
  // segment j-1 is reduced, and its buffer half is reused two steps later.
  size_t seg_elems = std::max<size_t>(1, max_segment_bytes / elem_size);
  const size_t segments = std::max<size_t>(2, (count + seg_elems - 1) / seg_elems);
  seg_elems = (count + segments - 1) / segments;
  auto seg_offset = [&](size_t j) { return std::min(count, j * seg_elems) * elem_size; };
  auto seg_length = [&](size_t j) {
    size_t b = std::min(count, j * seg_elems);
    return (std::min(count, b + seg_elems) - b) * elem_size;
  };
  auto chunk_offset = [&](long c) { return static_cast<size_t>(((c % size) + size) % size) * chunk; };

  // Two accumulators: step s receives into half s%2 while half (s-1)%2 is sent.
  std::vector<uint8_t> acc(2 * chunk);
  auto in = ctx->createUnboundBuffer(const_cast<void*>(send), size * chunk);
  auto accbuf = ctx->createUnboundBuffer(acc.data(), acc.size());
  const auto* send_bytes = static_cast<const uint8_t*>(send);
  auto* recv_bytes = static_cast<uint8_t*>(recv);

  const size_t steps = size - 1;
  const size_t units = steps * segments;
  // Step 0 sends our own chunk rank-1; step s receives the partial sum of
  // chunk rank-2-s from the left and adds our contribution; after the last
  // step (s = size-2) that is chunk rank, complete.
  auto post = [&](size_t u) {
    const size_t s = u / segments, j = u % segments;
    const size_t off = seg_offset(j), len = seg_length(j);
    accbuf->recv(left, slot, (s % 2) * chunk + off, len);
    if (s == 0) {
      in->send(right, slot, chunk_offset(rank - 1) + off, len);
    } else {
      accbuf->send(right, slot, ((s - 1) % 2) * chunk + off, len);
    }
  };
  auto complete = [&](size_t u) {
    const size_t s = u / segments, j = u % segments;
    const size_t off = seg_offset(j), len = seg_length(j);
    wait_recv(*accbuf, timeout);
    uint8_t* partial = acc.data() + (s % 2) * chunk + off;
    const uint8_t* own = send_bytes + chunk_offset(rank - 2 - static_cast<long>(s)) + off;
    uint8_t* out = (s == steps - 1) ? recv_bytes + off : partial;
    if (len > 0) reduce(out, partial, own, len / elem_size);
    wait_send(s == 0 ? *in : *accbuf, timeout);
  };
  // Units u-1 and u are in flight together; unit u only reuses buffers and
  // results of units <= u-2 (segments >= 2), which are complete.
  for (size_t u = 0; u < units; ++u) {
    post(u);
    if (u > 0) complete(u - 1);
  }
  complete(units - 1);
}

void alltoallv_bytes(const std::shared_ptr<gloo::Context>& ctx, const void* send, const size_t* send_offsets,
                     const size_t* send_lengths, void* recv, const size_t* recv_offsets, const size_t* recv_lengths,
                     uint64_t slot, std::chrono::milliseconds timeout) {
  const int size = ctx->size;
  const int rank = ctx->rank;
  size_t send_extent = 0, recv_extent = 0;
  for (int i = 0; i < size; ++i) {
    if (send_lengths[i]) send_extent = std::max(send_extent, send_offsets[i] + send_lengths[i]);
    if (recv_lengths[i]) recv_extent = std::max(recv_extent, recv_offsets[i] + recv_lengths[i]);
  }
  // My own block: not copied when it already sits in place (an in-place allgather), since
  // callers read it meanwhile (ByteGrad decodes it while it travels) and a copy onto itself
  // is still a write racing with those reads.
  uint8_t* own_dst = static_cast<uint8_t*>(recv) + recv_offsets[rank];
  const uint8_t* own_src = static_cast<const uint8_t*>(send) + send_offsets[rank];
  if (recv_lengths[rank] > 0 && own_dst != own_src) std::memmove(own_dst, own_src, recv_lengths[rank]);
  auto in = ctx->createUnboundBuffer(const_cast<void*>(send), send_extent);
  auto out = ctx->createUnboundBuffer(recv, recv_extent);
  // Empty messages are still exchanged so both sides count the same messages.
  for (int i = 1; i < size; ++i) {
    const int to = (rank + i) % size;
    const int from = (rank + size - i) % size;
    out->recv(from, slot, recv_lengths[from] ? recv_offsets[from] : 0, recv_lengths[from]);
    in->send(to, slot, send_lengths[to] ? send_offsets[to] : 0, send_lengths[to]);
  }
  for (int i = 1; i < size; ++i) {
    wait_send(*in, timeout);
    wait_recv(*out, timeout);
  }
}

void alltoall_bytes(const std::shared_ptr<gloo::Context>& ctx, const void* send, void* recv, size_t block_bytes,
                    uint64_t slot, std::chrono::milliseconds timeout) {
  const size_t size = static_cast<size_t>(ctx->size);
  std::vector<size_t> offsets(size), lengths(size, block_bytes);
  for (size_t i = 0; i < size; ++i) offsets[i] = i * block_bytes;
  alltoallv_bytes(ctx, send, offsets.data(), lengths.data(), recv, offsets.data(), lengths.data(), slot, timeout);
}

void allgather_bytes(const std::shared_ptr<gloo::Context>& ctx, const void* send, void* recv, size_t block_bytes,
                     uint64_t slot, std::chrono::milliseconds timeout) {
  const size_t size = static_cast<size_t>(ctx->size);
  std::vector<size_t> send_offsets(size, 0), recv_offsets(size), lengths(size, block_bytes);
  for (size_t i = 0; i < size; ++i) recv_offsets[i] = i * block_bytes;
  alltoallv_bytes(ctx, send, send_offsets.data(), lengths.data(), recv, recv_offsets.data(), lengths.data(), slot,
                  timeout);
}

}  // namespace gloo_algorithms
}  // namespace bagua
