#include "ops/compressed_exchange.h"

#include "kernels/minmax_uint8.h"
#include "ops/kernels.h"

namespace bagua {

namespace mm = minmax_uint8;

size_t compressed_exchange_bytes(size_t count, size_t n_chunks) { return mm::compressed_size(count, n_chunks); }

void compressed_scatter_reduce_gather(Communicator& c, const ExecContext& ctx, Span data, bool average) {
  const size_t n = static_cast<size_t>(c.size());
  const size_t r = static_cast<size_t>(c.rank());
  const size_t chunk = data.count / n;
  const size_t record = mm::record_bytes(chunk);
  const size_t bytes = mm::compressed_size(data.count, n);
  uint8_t* send = static_cast<uint8_t*>(ctx.scratch->get(0, bytes));
  uint8_t* recv = static_cast<uint8_t*>(ctx.scratch->get(1, bytes));
  uint8_t* mine = static_cast<uint8_t*>(data.data) + r * chunk * dtype_size(data.dtype);

  step_kernels::compress(ctx, data.data, data.count, data.dtype, n, send, -1);
  c.alltoall(send, recv, record, DType::kUInt8, ctx.stream);
  step_kernels::reduce_chunks(ctx, recv, chunk, n, data.dtype, average, mine);
  step_kernels::compress(ctx, data.data, data.count, data.dtype, n, send, static_cast<int64_t>(r));
  c.allgather(send + r * record, send, record, DType::kUInt8, ctx.stream);
  step_kernels::decompress(ctx, send, data.count, data.dtype, n, data.data, -1);
}

}  // namespace bagua
