#include "ops/decentralized.h"

#include <cstring>

#include "bucket/host_memory.h"
#include "ops/elementwise.h"

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

DecentralizedOp::DecentralizedOp(CommSet comms, PeerMode mode, int64_t communication_interval, bool hierarchical)
    : comms_(std::move(comms)), mode_(mode), interval_(communication_interval), hierarchical_(hierarchical) {
  if (!comms_.global) throw InvalidArgument("decentralized: no communicator");
  if (interval_ < 1)
    throw InvalidArgument("decentralized: communication_interval must be >= 1, got " + std::to_string(interval_));
  if (hierarchical_) comms_.check_hierarchical("decentralized");
  if (mode_ == PeerMode::kShiftOne) {
    const int n = hierarchical_ ? comms_.num_nodes() : comms_.global->size();
    if (n % 2 != 0)
      throw InvalidArgument(
          "decentralized: peer_selection_mode='shift_one' pairs peers, so it needs an even number of them; got " +
          std::to_string(n) +
          (hierarchical_ ? " nodes (hierarchical mode exchanges between nodes: use an even node count, or "
                           "hierarchical=False)"
                         : " processes"));
  }
}

std::string DecentralizedOp::describe() const {
  return std::string("decentralized(peer_selection_mode=") + peer_mode_name(mode_) +
         ", communication_interval=" + std::to_string(interval_) +
         ", hierarchical=" + (hierarchical_ ? "true" : "false") + ")";
}

void DecentralizedOp::set_step(int64_t step) {
  if (step < 0) throw InvalidArgument("decentralized: step must be >= 0");
  step_.store(step);
}

void DecentralizedOp::bind(const BucketPtr& bucket) {
  if (bucket_) throw InvalidArgument(describe() + " is already part of another bucket's chain");
  if (!is_floating(bucket->dtype()))
    throw InvalidArgument(describe() + ": " + bucket->describe() + " holds " + dtype_name(bucket->dtype()) +
                          "; weight averaging needs a floating dtype");
  peer_ = allocate_host_memory(bucket->nbytes());
  std::memcpy(peer_.get(), bucket->data(), bucket->nbytes());
  if (hierarchical_ && mode_ == PeerMode::kShiftOne && comms_.is_leader())
    scratch_ = allocate_host_memory(bucket->nbytes());
  bucket_ = bucket;
}

void DecentralizedOp::exchange_and_average(Communicator& c, const void* mine, void* peer, void* scratch,
                                           size_t count, DType dt, int64_t comm_step) {
  if (mode_ == PeerMode::kAll) {
    if (peer != mine) std::memcpy(peer, mine, count * dtype_size(dt));
    c.allreduce(peer, peer, count, dt, ReduceOp::kAvg);
    return;
  }
  // shift_one: receive the partner's weights into `recv`, then average with ours.
  const int partner = shift_one_peer(c.rank(), c.size(), comm_step);
  void* recv = (peer == mine) ? scratch : peer;
  if (c.rank() < partner) {
    c.send(mine, count, dt, partner);
    c.recv(recv, count, dt, partner);
  } else {
    c.recv(recv, count, dt, partner);
    c.send(mine, count, dt, partner);
  }
  if (recv == peer) {
    average_into_cpu(peer, mine, count, dt);  // flat: peer holds the partner's weights
  } else {
    average_into_cpu(peer, recv, count, dt);  // hierarchical: peer holds ours (the node average)
  }
}

void DecentralizedOp::execute(Bucket& bucket) {
  struct Running {
    std::atomic<bool>& flag;
    explicit Running(std::atomic<bool>& f) : flag(f) { flag.store(true); }
    ~Running() { flag.store(false); }
  } running(running_);

  const int64_t step = step_.fetch_add(1);
  if (step % interval_ != 0) {
    last_communicated_.store(false);
    return;
  }
  last_communicated_.store(false);
  const int64_t comm_step = step / interval_;
  const size_t count = bucket.numel();
  const DType dt = bucket.dtype();
  void* peer = peer_.get();

  if (!hierarchical_) {
    exchange_and_average(*comms_.global, bucket.data(), peer, nullptr, count, dt, comm_step);
  } else {
    const bool leader = comms_.is_leader();
    comms_.intra->reduce(bucket.data(), leader ? peer : nullptr, count, dt, ReduceOp::kAvg, 0);
    if (leader) exchange_and_average(*comms_.inter, peer, peer, scratch_.get(), count, dt, comm_step);
    comms_.intra->broadcast(peer, count, dt, 0);
  }
  last_communicated_.store(true);
}

bool DecentralizedOp::copy_back() {
  if (!bucket_) throw InvalidArgument(describe() + " is not part of a bucket's chain");
  if (running_.load()) throw Error(describe() + ": copy_back() while the op runs; call the engine's wait() first");
  if (!last_communicated_.load()) return false;
  std::memcpy(bucket_->data(), peer_.get(), bucket_->nbytes());
  return true;
}

}  // namespace bagua
