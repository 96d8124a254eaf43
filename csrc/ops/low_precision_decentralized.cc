#include "ops/low_precision_decentralized.h"

#include "kernels/minmax_uint8.h"
#include "ops/alongside.h"
#include "ops/elementwise.h"
#include "ops/hierarchical.h"
#include "ops/kernels.h"

namespace bagua {

namespace mm = minmax_uint8;

LowPrecisionDecentralizedStep::LowPrecisionDecentralizedStep(CommSet comms, const StepParams& params)
    : comms_(std::move(comms)) {
  const std::string name = "low_precision_decentralized";
  params.check_known(name, {"communication_interval", "hierarchical"});
  interval_ = params.get_int(name, "communication_interval", 1);
  hierarchical_ = params.get_bool(name, "hierarchical", false);
  if (!comms_.global) throw InvalidArgument(name + ": no communicator");
  if (interval_ < 1)
    throw InvalidArgument(name + ": communication_interval must be >= 1, got " + std::to_string(interval_));
  if (hierarchical_) comms_.check_hierarchical(name);
}

std::string LowPrecisionDecentralizedStep::describe() const {
  return std::string("low_precision_decentralized(communication_interval=") + std::to_string(interval_) +
         ", hierarchical=" + (hierarchical_ ? "true" : "false") + ")";
}

void LowPrecisionDecentralizedStep::check(DType dtype, size_t count) const {
  if (!is_floating(dtype))
    throw InvalidArgument(describe() + ": weights of " + dtype_name(dtype) +
                          "; MinMaxUInt8 compression needs float32, float64, float16 or bfloat16");
}

bool LowPrecisionDecentralizedStep::run(const ExecContext&, Span, Span, int64_t) const {
  throw InvalidArgument(describe() + ": needs its replicas; run it through run_with_state()");
}

void LowPrecisionDecentralizedStep::ring(Communicator& c, const ExecContext& ctx, Span data,
                                         const std::vector<Span>& state) const {
  const Span& w = state[0];
  const Span& l = state[1];
  const Span& r = state[2];
  const size_t record = mm::record_bytes(data.count);
  uint8_t* mine = static_cast<uint8_t*>(ctx.scratch->get(0, 2 * record));
  uint8_t* theirs = static_cast<uint8_t*>(ctx.scratch->get(1, 2 * record));
  void* decoded = ctx.scratch->get(2, data.nbytes());
  void* decoded_mine = ctx.scratch->get(3, data.nbytes());

  // Two ranks: the one peer is both neighbours, so its single Q travels once
  // (half the bytes of sending it as record 0 and record 1) and is decoded once
  // for L and R; the values are the same as with two records.
  const int n = c.size();
  const int me = c.rank();
  const int left = (me - 1 + n) % n;
  const int right = (me + 1) % n;
  const bool one_peer = n == 2;

  step_kernels::replica_diff(ctx, data.data, w.data, l.data, r.data, data.count, data.dtype);
  step_kernels::compress(ctx, data.data, data.count, data.dtype, 1, mine, -1);
  if (!one_peer) step_kernels::copy(ctx, mine + record, mine, record);

  // One alltoall_v: record 0 of `mine` to the left peer, record 1 to the right
  // one; from the left into record 0 of `theirs`, from the right into record 1.
  // Alone, both records go to myself.
  std::vector<size_t> send_counts(n, 0), send_displs(n, 0), recv_counts(n, 0), recv_displs(n, 0);
  send_counts[left] += record;
  recv_counts[left] += record;
  if (right != left) {
    send_counts[right] = record;
    send_displs[right] = record;
    recv_counts[right] = record;
    recv_displs[right] = record;
  } else if (!one_peer) {
    send_counts[right] = 2 * record;
    recv_counts[right] = 2 * record;
  }
  // My own update (5) needs nothing from the peers: it runs while the records travel.
  run_alongside(
      ctx, data.count,
      [&] {
        c.alltoall_v(mine, send_counts, send_displs, theirs, recv_counts, recv_displs, DType::kUInt8, ctx.stream);
      },
      [&] {
        step_kernels::decompress(ctx, mine, data.count, data.dtype, 1, decoded_mine, -1);
        step_kernels::copy(ctx, data.data, w.data, data.nbytes());
        step_kernels::add_into(ctx, data.data, decoded_mine, data.count, data.dtype);
        step_kernels::copy(ctx, w.data, data.data, data.nbytes());
      });

  step_kernels::decompress(ctx, theirs, data.count, data.dtype, 1, decoded, -1);
  step_kernels::add_into(ctx, l.data, decoded, data.count, data.dtype);
  if (!one_peer) step_kernels::decompress(ctx, theirs + record, data.count, data.dtype, 1, decoded, -1);
  step_kernels::add_into(ctx, r.data, decoded, data.count, data.dtype);
}

bool LowPrecisionDecentralizedStep::run_with_state(const ExecContext& ctx, Span data, Span,
                                                   const std::vector<Span>& state, int64_t step) const {
  if (!communicates(step)) return false;
  if (state.size() != static_cast<size_t>(kState))
    throw InvalidArgument(describe() + ": needs " + std::to_string(kState) + " state spans (W, L, R), got " +
                          std::to_string(state.size()));
  for (const Span& s : state)
    if (s.count != data.count || s.dtype != data.dtype)
      throw InvalidArgument(describe() + ": a state span differs from the weights in size or dtype");
  if (data.count == 0) return true;
  run_centralized(comms_, ctx, hierarchical_, data, ReduceOp::kAvg,
                  [&](Communicator& c) { ring(c, ctx, data, state); });
  return true;
}

}  // namespace bagua
