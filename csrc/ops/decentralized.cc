#include "ops/decentralized.h"

#include "ops/elementwise.h"
#include "ops/kernels.h"

namespace bagua {

PeerMode parse_peer_mode(const std::string& mode) {
  if (mode == "all") return PeerMode::kAll;
  if (mode == "shift_one") return PeerMode::kShiftOne;
  throw InvalidArgument("unknown peer_selection_mode '" + mode + "' (use 'all' or 'shift_one')");
}

const char* peer_mode_name(PeerMode mode) { return mode == PeerMode::kAll ? "all" : "shift_one"; }

int shift_one_peer(int rank, int n, int64_t comm_step) {
  const int64_t h = n / 2;
  const int64_t r = rank;
  if (r < h) return static_cast<int>(h + (comm_step + r) % h);
  const int64_t m = ((r - h - comm_step) % h + h) % h;  // Euclidean mod
  return static_cast<int>(m);
}

DecentralizedStep::DecentralizedStep(CommSet comms, const StepParams& params) : comms_(std::move(comms)) {
  const std::string name = "decentralized";
  params.check_known(name, {"peer_selection_mode", "communication_interval", "hierarchical"});
  mode_ = parse_peer_mode(params.get_string(name, "peer_selection_mode", "all"));
  interval_ = params.get_int(name, "communication_interval", 1);
  hierarchical_ = params.get_bool(name, "hierarchical", false);
  if (!comms_.global) throw InvalidArgument(name + ": no communicator");
  if (interval_ < 1)
    throw InvalidArgument(name + ": communication_interval must be >= 1, got " + std::to_string(interval_));
  if (hierarchical_) comms_.check_hierarchical(name);
  if (mode_ == PeerMode::kShiftOne) {
    const int n = hierarchical_ ? comms_.num_nodes() : comms_.global->size();
    if (n % 2 != 0)
      throw InvalidArgument(
          name + ": peer_selection_mode='shift_one' pairs peers, so it needs an even number of them; got " +
          std::to_string(n) +
          (hierarchical_ ? " nodes (hierarchical mode exchanges between nodes: use an even node count, or "
                           "hierarchical=False)"
                         : " processes"));
  }
}

std::string DecentralizedStep::describe() const {
  return std::string("decentralized(peer_selection_mode=") + peer_mode_name(mode_) +
         ", communication_interval=" + std::to_string(interval_) +
         ", hierarchical=" + (hierarchical_ ? "true" : "false") + ")";
}

void DecentralizedStep::check(DType dtype, size_t count) const {
  if (!is_floating(dtype))
    throw InvalidArgument(describe() + ": weights of " + dtype_name(dtype) +
                          "; weight averaging needs a floating dtype");
}

// peer <- average of `mine` with the peers. `mine` and `peer` may be the same
// memory (hierarchical leaders exchange the node average in place).
void DecentralizedStep::exchange_and_average(Communicator& c, const ExecContext& ctx, Span mine, Span peer,
                                             int64_t comm_step) const {
  if (mode_ == PeerMode::kAll) {
    step_kernels::copy(ctx, peer.data, mine.data, mine.nbytes());
    c.allreduce(peer.data, peer.data, peer.count, peer.dtype, ReduceOp::kAvg, ctx.stream);
    return;
  }
  const int partner = shift_one_peer(c.rank(), c.size(), comm_step);
  void* recv = (peer.data == mine.data) ? ctx.scratch->get(0, mine.nbytes()) : peer.data;
  if (c.rank() < partner) {
    c.send(mine.data, mine.count, mine.dtype, partner, ctx.stream);
    c.recv(recv, mine.count, mine.dtype, partner, ctx.stream);
  } else {
    c.recv(recv, mine.count, mine.dtype, partner, ctx.stream);
    c.send(mine.data, mine.count, mine.dtype, partner, ctx.stream);
  }
  // flat: peer holds the partner's weights; hierarchical: peer holds ours (the node average)
  step_kernels::average_into(ctx, peer.data, recv == peer.data ? mine.data : recv, mine.count, mine.dtype);
}

bool DecentralizedStep::run(const ExecContext& ctx, Span data, Span result, int64_t step) const {
  if (!communicates(step)) return false;
  if (result.data == data.data || result.count != data.count || result.dtype != data.dtype)
    throw InvalidArgument(describe() + ": the result must be a separate buffer of the weights' size and dtype");
  const int64_t comm_step = step / interval_;
  if (!hierarchical_) {
    exchange_and_average(*comms_.global, ctx, data, result, comm_step);
  } else {
    const bool leader = comms_.is_leader();
    comms_.intra->reduce(data.data, leader ? result.data : nullptr, data.count, data.dtype, ReduceOp::kAvg, 0,
                         ctx.stream);
    if (leader) exchange_and_average(*comms_.inter, ctx, result, result, comm_step);
    comms_.intra->broadcast(result.data, result.count, result.dtype, 0, ctx.stream);
  }
  return true;
}

}  // namespace bagua
