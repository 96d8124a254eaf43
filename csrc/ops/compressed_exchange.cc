#include "ops/compressed_exchange.h"

#include <vector>

#include "kernels/minmax_uint8.h"
#include "ops/alongside.h"
#include "ops/kernels.h"

namespace bagua {

namespace mm = minmax_uint8;

size_t compressed_exchange_bytes(size_t count, size_t n_chunks) { return mm::compressed_size(count, n_chunks); }

void compressed_scatter_reduce_gather(Communicator& c, const ExecContext& ctx, Span data, bool average,
                                      const Span* error, const Codec* codec) {
  static const Codec kMinmaxUint8 = Codec::make("compressed exchange", "minmax_uint8", 1.0);
  const Codec& k = codec ? *codec : kMinmaxUint8;
  const size_t n = static_cast<size_t>(c.size());
  const size_t r = static_cast<size_t>(c.rank());
  const size_t chunk = data.count / n;
  const size_t record = k.record_bytes(chunk);
  const size_t bytes = k.compressed_size(data.count, n);
  uint8_t* send = static_cast<uint8_t*>(ctx.scratch->get(0, bytes));
  uint8_t* recv = static_cast<uint8_t*>(ctx.scratch->get(1, bytes));
  uint8_t* mine = static_cast<uint8_t*>(data.data) + r * chunk * dtype_size(data.dtype);

  // 1-2. The peers' records are compressed first; my own one is compressed straight
  // into its place in `recv` while theirs travel (records are per chunk, so the
  // bytes are those of compressing all chunks at once).
  std::vector<size_t> counts(n, record), displs(n);
  for (size_t p = 0; p < n; ++p) displs[p] = p * record;
  counts[r] = 0;
  if (error) step_kernels::add_into(ctx, data.data, error->data, data.count, data.dtype);
  for (size_t p = 0; p < n; ++p)
    if (p != r) k.compress(ctx, data.data, data.count, data.dtype, n, send, static_cast<int64_t>(p));
  run_alongside(
      ctx, chunk, [&] { c.alltoall_v(send, counts, displs, recv, counts, displs, DType::kUInt8, ctx.stream); },
      [&] {
        k.compress(ctx, data.data, data.count, data.dtype, n, recv, static_cast<int64_t>(r));
        // the residual only reads the records the wire sends (and mine, which it does not touch)
        if (error)
          for (size_t p = 0; p < n; ++p)
            k.residual(ctx, p == r ? recv : send, data.data, data.count, data.dtype, n, error->data,
                       static_cast<int64_t>(p));
      });
  // 3-4.
  k.reduce_chunks(ctx, recv, chunk, n, data.dtype, average, mine);
  k.compress(ctx, data.data, data.count, data.dtype, n, send, static_cast<int64_t>(r));
  // 5-6. My record is decoded while it travels to the peers; theirs once they arrived.
  run_alongside(
      ctx, chunk, [&] { c.allgather(send + r * record, send, record, DType::kUInt8, ctx.stream); },
      [&] { k.decompress(ctx, send, data.count, data.dtype, n, data.data, static_cast<int64_t>(r)); });
  for (size_t p = 0; p < n; ++p)
    if (p != r) k.decompress(ctx, send, data.count, data.dtype, n, data.data, static_cast<int64_t>(p));
}

void compressed_allgather_reduce(Communicator& c, const ExecContext& ctx, Span data, bool average, const Span* error,
                                 const Codec& codec) {
  const size_t n = static_cast<size_t>(c.size());
  const size_t r = static_cast<size_t>(c.rank());
  const size_t record = codec.record_bytes(data.count);
  uint8_t* records = static_cast<uint8_t*>(ctx.scratch->get(1, n * record));
  uint8_t* mine = records + r * record;
  if (error) step_kernels::add_into(ctx, data.data, error->data, data.count, data.dtype);
  codec.compress(ctx, data.data, data.count, data.dtype, 1, mine);
  run_alongside(
      ctx, data.count, [&] { c.allgather(mine, records, record, DType::kUInt8, ctx.stream); },
      [&] {
        if (error) codec.residual(ctx, mine, data.data, data.count, data.dtype, 1, error->data);
      });
  codec.reduce_chunks(ctx, records, data.count, n, data.dtype, average, data.data);
}

}  // namespace bagua
