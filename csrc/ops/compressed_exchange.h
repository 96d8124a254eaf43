// The compressed exchanges: the MinMaxUInt8 scatter-reduce-gather shared by
// ByteGrad, QAdam and low-precision decentralized SGD, which runs any dense
// codec (ops/codec.h; LocalSteps' low-bit pseudo-gradients), and the allgather
// of the sparse (top-k) codecs.
//
// scatter_reduce_gather on a communicator of n ranks, rank r, over `data`
// (count divisible by n) split in n chunks:
//   1. compress all n chunks (MinMaxUInt8: per-chunk min/max + uint8 codes);
//   2. alltoall of the compressed records: rank r receives chunk r of every peer;
//   3. decode those n records and sum them in float32 (divide by n when
//      averaging) into chunk r of `data`;
//   4. recompress chunk r;  5. allgather the records;  6. decode all chunks.
// Every element is thus quantised twice; each rank sends and receives
// 2 (n - 1) / n records' bytes per element of `data` (MinMaxUInt8: 8 bits plus
// a 64-byte-aligned header per chunk; the low-bit codecs: kernels/lowbit.h).
// Scratch slots 0 and 1 hold the compressed records.
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
#include "ops/codec.h"
#include "ops/algorithm_step.h"

namespace bagua {

void compressed_scatter_reduce_gather(Communicator& comm, const ExecContext& ctx, Span data, bool average,
                                      const Span* error = nullptr, const Codec* codec = nullptr);

// Bytes of scratch compressed_scatter_reduce_gather needs per slot.
size_t compressed_exchange_bytes(size_t count, size_t n_chunks);

// compressed_allgather_reduce on n ranks, for codecs whose ranks keep
// different elements (top-k): with error feedback data <- data + error; each
// rank compresses all of `data` as one record (error <- data - decompress of
// it); an allgather gives every rank every record; each rank decodes them and
// sums them in rank order in float32 (divided by n when averaging) into
// `data`. Every element is quantised once and every rank gets the same bits;
// each rank sends its record and receives n - 1 (a ring allgather sends and
// receives (n - 1) records). Scratch slot 1 holds the n records.
void compressed_allgather_reduce(Communicator& comm, const ExecContext& ctx, Span data, bool average, const Span* error,
                                 const Codec& codec);

}  // namespace bagua
