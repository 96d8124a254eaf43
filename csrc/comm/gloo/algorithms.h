// Collectives that this Gloo release lacks in its options API, written on
// Gloo's unbound buffers, plus the slot numbering they share with the
// communicator. Gloo's own algorithms use slot prefixes 0x01-0x08 in the top
// byte (see gloo/types.h); ours start at 0x40 so they never collide.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>

#include <gloo/context.h>

#include "kernels/reduce.h"

namespace bagua {
namespace gloo_algorithms {

constexpr uint8_t kReduceScatterSlotPrefix = 0x40;
constexpr uint8_t kSendRecvSlotPrefix = 0x41;
constexpr uint8_t kAlltoallvSlotPrefix = 0x42;
constexpr uint8_t kAlltoallSlotPrefix = 0x43;
constexpr uint8_t kAllgatherSlotPrefix = 0x44;

// Same layout as gloo::Slot::build: prefix in bits 56-63, tag in bits 24-55;
// `low` (< 2^24) distinguishes sub-streams of one operation.
inline uint64_t make_slot(uint8_t prefix, uint32_t tag, uint32_t low = 0) {
  return (static_cast<uint64_t>(prefix) << 56) | (static_cast<uint64_t>(tag) << 24) | (low & 0xffffffu);
}

// Ring reduce-scatter: `send` holds size chunks of `count` elements of
// `elem_size` bytes; rank r ends with the reduction of chunk r in `recv`
// (which may alias chunk r of `send`). Each chunk travels in segments of at
// most `max_segment_bytes`, two in flight, so I/O overlaps the reductions.
void ring_reduce_scatter(const std::shared_ptr<gloo::Context>& ctx, const void* send, void* recv, size_t count,
                         size_t elem_size, ReduceFn reduce, uint64_t slot, std::chrono::milliseconds timeout,
                         size_t max_segment_bytes);

// All-to-all with arbitrary byte offsets and lengths per peer (Gloo's
// alltoallv only takes packed counts). Offsets and lengths hold size entries.
void alltoallv_bytes(const std::shared_ptr<gloo::Context>& ctx, const void* send, const size_t* send_offsets,
                     const size_t* send_lengths, void* recv, const size_t* recv_offsets, const size_t* recv_lengths,
                     uint64_t slot, std::chrono::milliseconds timeout);

// All-to-all of equal blocks of `block_bytes` (send and recv must not overlap).
// Like alltoallv_bytes, every receive and send is posted at once, so both
// directions of each link carry data together (Gloo's own alltoall and
// allgather reach about two thirds of a shaped link's rate each way).
void alltoall_bytes(const std::shared_ptr<gloo::Context>& ctx, const void* send, void* recv, size_t block_bytes,
                    uint64_t slot, std::chrono::milliseconds timeout);

// Allgather by direct exchange: my block goes to every peer while every peer's
// block arrives (all posted at once). `send` may be my block of `recv` (then left untouched).
void allgather_bytes(const std::shared_ptr<gloo::Context>& ctx, const void* send, void* recv, size_t block_bytes,
                     uint64_t slot, std::chrono::milliseconds timeout);

}  // namespace gloo_algorithms
}  // namespace bagua
