// The MinMaxUInt8 compressed exchange shared by ByteGrad, QAdam and
// low-precision decentralized SGD.
//
// scatter_reduce_gather on a communicator of n ranks, rank r, over `data`
// (count divisible by n) split in n chunks:
//   1. compress all n chunks (per-chunk min/max + uint8 codes);
//   2. alltoall of the compressed records: rank r receives chunk r of every peer;
//   3. decode those n records and sum them in float32 (divide by n when
//      averaging) into chunk r of `data`;
//   4. recompress chunk r;  5. allgather the records;  6. decode all chunks.
// Every element is thus quantised twice. Scratch slots 0 and 1 hold the
// compressed records.
// Error feedback (`error`, a span of the data's count and dtype; ByteGrad's
// state): before 1, data <- data + error; after 1, error <- data -
// decompress(the records of 1), for all n chunks: the residual of this rank's
// own (first) quantisation only. The second one (4) is not fed back: its
// residual belongs to chunk r's reduced value, which no rank holds unquantised.
// Without `error` nothing changes, bytes nor values.
// Link use: every send and receive of an exchange is posted at once (both
// directions busy), and the CPU work that does not wait for the wire overlaps
// it (ops/alongside.h): my own record is compressed while the peers' records
// travel (2), and decoded while it travels to them (6). Records are per chunk,
// so the bytes and values are those of the sequence above.
#pragma once

#include "comm/communicator.h"
#include "ops/algorithm_step.h"

namespace bagua {

void compressed_scatter_reduce_gather(Communicator& comm, const ExecContext& ctx, Span data, bool average,
                                      const Span* error = nullptr);

// Bytes of scratch compressed_scatter_reduce_gather needs per slot.
size_t compressed_exchange_bytes(size_t count, size_t n_chunks);

}  // namespace bagua
