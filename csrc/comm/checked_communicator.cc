#include "comm/checked_communicator.h"

#include <array>
#include <string>
#include <vector>

#include "comm/call_agreement.h"
#include "comm/op_desc.h"
#include "common/error.h"

namespace bagua {
namespace {

// Wire form of a send/recv descriptor (the call descriptor's form).
using Wire = CallWire;
constexpr size_t kWords = kCallWords;

class CheckedCommunicator : public Communicator {
 public:
  explicit CheckedCommunicator(CommunicatorPtr inner)
      : inner_(std::move(inner)), send_seq_(inner_->size(), 0), recv_seq_(inner_->size(), 0) {}

  int rank() const override { return inner_->rank(); }
  int size() const override { return inner_->size(); }
  DeviceType device_type() const override { return inner_->device_type(); }
  std::chrono::milliseconds timeout() const override { return inner_->timeout(); }
  std::string describe() const override { return inner_->describe(); }

  void allreduce(const void* send, void* recv, size_t count, DType dtype, ReduceOp op, Stream stream) override {
    check({OpKind::kAllreduce, dtype, static_cast<int64_t>(count), -1, op}, stream);
    inner_->allreduce(send, recv, count, dtype, op, stream);
  }
  void reduce(const void* send, void* recv, size_t count, DType dtype, ReduceOp op, int root, Stream stream) override {
    check({OpKind::kReduce, dtype, static_cast<int64_t>(count), root, op}, stream);
    inner_->reduce(send, recv, count, dtype, op, root, stream);
  }
  void broadcast(void* buf, size_t count, DType dtype, int root, Stream stream) override {
    check({OpKind::kBroadcast, dtype, static_cast<int64_t>(count), root}, stream);
    inner_->broadcast(buf, count, dtype, root, stream);
  }
  void allgather(const void* send, void* recv, size_t count, DType dtype, Stream stream) override {
    check({OpKind::kAllgather, dtype, static_cast<int64_t>(count)}, stream);
    inner_->allgather(send, recv, count, dtype, stream);
  }
  void gather(const void* send, void* recv, size_t count, DType dtype, int root, Stream stream) override {
    check({OpKind::kGather, dtype, static_cast<int64_t>(count), root}, stream);
    inner_->gather(send, recv, count, dtype, root, stream);
  }
  void scatter(const void* send, void* recv, size_t count, DType dtype, int root, Stream stream) override {
    check({OpKind::kScatter, dtype, static_cast<int64_t>(count), root}, stream);
    inner_->scatter(send, recv, count, dtype, root, stream);
  }
  void reduce_scatter(const void* send, void* recv, size_t count, DType dtype, ReduceOp op, Stream stream) override {
    check({OpKind::kReduceScatter, dtype, static_cast<int64_t>(count), -1, op}, stream);
    inner_->reduce_scatter(send, recv, count, dtype, op, stream);
  }
  void alltoall(const void* send, void* recv, size_t count, DType dtype, Stream stream) override {
    check({OpKind::kAlltoall, dtype, static_cast<int64_t>(count)}, stream);
    inner_->alltoall(send, recv, count, dtype, stream);
  }
  void alltoall_v(const void* send, const std::vector<size_t>& send_counts, const std::vector<size_t>& send_displs,
                  void* recv, const std::vector<size_t>& recv_counts, const std::vector<size_t>& recv_displs,
                  DType dtype, Stream stream) override {
    OpDesc d{OpKind::kAlltoallV, dtype, 0};
    for (size_t c : send_counts) d.count += static_cast<int64_t>(c);
    check(d, stream);
    check_alltoallv_counts(send_counts, recv_counts, stream);
    inner_->alltoall_v(send, send_counts, send_displs, recv, recv_counts, recv_displs, dtype, stream);
  }
  void send(const void* buf, size_t count, DType dtype, int peer, Stream stream) override {
    check_p2p({OpKind::kSend, dtype, static_cast<int64_t>(count), peer}, stream);
    inner_->send(buf, count, dtype, peer, stream);
  }
  void recv(void* buf, size_t count, DType dtype, int peer, Stream stream) override {
    check_p2p({OpKind::kRecv, dtype, static_cast<int64_t>(count), peer}, stream);
    inner_->recv(buf, count, dtype, peer, stream);
  }
  void barrier(Stream stream) override {
    check({OpKind::kBarrier}, stream);
    inner_->barrier(stream);
  }
  void close() override { inner_->close(); }
  // Agreement words of a communicator this one controls: already a check.
  void agreement_allgather(const int64_t* words, size_t n, int64_t* all) override {
    inner_->agreement_allgather(words, n, all);
  }

 private:
  std::string who(int r) const { return "rank " + std::to_string(r); }

  [[noreturn]] void mismatch(const std::string& what) const {
    throw MismatchError(describe() + ": debug checks: " + what);
  }

  void check(const OpDesc& d, Stream stream) {
    const int n = size();
    const uint64_t seq = seq_++;
    Wire mine = encode_call(d, seq);
    std::vector<int64_t> all(kWords * n);
    inner_->allgather(mine.data(), all.data(), kWords, DType::kInt64, stream);
    const std::string why = call_disagreement(all.data(), n, rank());
    if (!why.empty()) mismatch(why);
  }

  // Every rank sees the whole count matrix, so every rank raises together.
  void check_alltoallv_counts(const std::vector<size_t>& send_counts, const std::vector<size_t>& recv_counts,
                              Stream stream) {
    const int n = size();
    if (send_counts.size() != static_cast<size_t>(n) || recv_counts.size() != static_cast<size_t>(n))
      return;  // the wrapped communicator reports the bad argument
    std::vector<int64_t> mine = encode_alltoallv_counts(send_counts, recv_counts);
    std::vector<int64_t> all(2 * n * n);
    inner_->allgather(mine.data(), all.data(), 2 * n, DType::kInt64, stream);
    const std::string why = alltoallv_disagreement(all.data(), n);
    if (!why.empty()) mismatch(why);
  }

  void check_p2p(const OpDesc& d, Stream stream) {
    const int peer = static_cast<int>(d.root);
    if (peer < 0 || peer >= size() || peer == rank()) return;  // reported by the wrapped one
    const bool sending = d.kind == OpKind::kSend;
    const uint64_t seq = sending ? send_seq_[peer]++ : recv_seq_[peer]++;
    Wire mine = encode_call(d, seq), theirs{};
    // The lower rank speaks first, so two ranks that both send (or both
    // receive) still exchange descriptors instead of waiting on each other.
    if (rank() < peer) {
      inner_->send(mine.data(), kWords, DType::kInt64, peer, stream);
      inner_->recv(theirs.data(), kWords, DType::kInt64, peer, stream);
    } else {
      inner_->recv(theirs.data(), kWords, DType::kInt64, peer, stream);
      inner_->send(mine.data(), kWords, DType::kInt64, peer, stream);
    }
    const DecodedCall other = decode_call(theirs.data());
    const OpKind expected = sending ? OpKind::kRecv : OpKind::kSend;
    const bool ok = other.valid && other.desc.kind == expected && other.desc.root == rank() &&
                    other.desc.dtype == d.dtype && other.desc.count == d.count &&
                    other.seq == static_cast<int64_t>(seq);
    if (ok) return;
    // Neither side goes on with this call: take back its sequence number.
    (sending ? send_seq_ : recv_seq_)[peer]--;
    if (!other.valid) mismatch(who(peer) + " sent a malformed call descriptor");
    mismatch(who(peer) + " called " + to_string(other.desc) + " while " + who(rank()) + " called " + to_string(d) +
             (other.seq != static_cast<int64_t>(seq) && other.desc.kind == expected
                  ? " (message #" + std::to_string(other.seq) + " vs #" + std::to_string(seq) + ")"
                  : std::string()));
  }

  CommunicatorPtr inner_;
  uint64_t seq_ = 0;
  std::vector<uint64_t> send_seq_;
  std::vector<uint64_t> recv_seq_;
};

}  // namespace

CommunicatorPtr make_checked_communicator(CommunicatorPtr inner) {
  if (!inner) throw InvalidArgument("make_checked_communicator: communicator is null");
  return std::make_shared<CheckedCommunicator>(std::move(inner));
}

}  // namespace bagua
