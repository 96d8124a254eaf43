// What ranks must agree on before a collective, in a fixed-size wire form.
//
// Every rank encodes its call (operation, sequence number, dtype, count, root,
// reduce op, and an announcement of the calls that follow it) in kCallWords
// int64 words; after an allgather of these words
// every rank runs the same comparison on the same data, so every rank reaches
// the same verdict and raises together. The wire size never depends on the
// call, so ranks that disagree still exchange the descriptors safely.
// alltoall_v needs a second, fixed-size exchange of the count matrix.
// Used by the Gloo communicator before every collective (a size mismatch in
// Gloo aborts the process on its I/O thread) and by the debug checks.
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <vector>

#include "comm/op_desc.h"

namespace bagua {

constexpr size_t kCallWords = 9;
using CallWire = std::array<int64_t, kCallWords>;

// The calls a rank says will follow the one it agrees on now: their number
// and a hash of their descriptors (Communicator::expect_calls). When every
// rank announces the same non-empty list, those calls need no agreement.
struct Announcement {
  int64_t calls = 0;
  int64_t hash = 0;
};
Announcement announce(const std::vector<OpDesc>& calls);

CallWire encode_call(const OpDesc& d, uint64_t seq, Announcement next = {});

// Whether two descriptors are the same call, every field compared.
bool same_desc(const OpDesc& a, const OpDesc& b);

// One rank's words read back; `valid` is false when they are not a call
// descriptor at all (ranks out of step).
struct DecodedCall {
  bool valid;
  OpDesc desc;
  int64_t seq;
  Announcement next;
};
DecodedCall decode_call(const int64_t* words);

// `all` holds size * kCallWords words (rank order). Returns "" when every rank
// made the same call at the same sequence number, otherwise a message naming
// the first rank that differs from rank 0 and both calls.
std::string call_disagreement(const int64_t* all, int size, int my_rank);

// The calls every rank announced alike in `all` (as call_disagreement reads
// it); 0 when any two announcements differ.
int64_t common_announcement(const int64_t* all, int size);

// alltoall_v counts of this rank: send_counts then recv_counts (2 * size words).
std::vector<int64_t> encode_alltoallv_counts(const std::vector<size_t>& send_counts,
                                             const std::vector<size_t>& recv_counts);

// `all` holds size * 2 * size words. "" when every rank sends each peer as
// many elements as that peer expects from it.
std::string alltoallv_disagreement(const int64_t* all, int size);

}  // namespace bagua
