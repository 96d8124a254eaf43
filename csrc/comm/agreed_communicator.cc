#include "comm/agreed_communicator.h"

#include <deque>
#include <mutex>
#include <string>
#include <vector>

#include "comm/call_agreement.h"
#include "common/error.h"

namespace bagua {
namespace {

class AgreedCommunicator : public Communicator {
 public:
  AgreedCommunicator(CommunicatorPtr data, CommunicatorPtr control)
      : data_(std::move(data)), control_(std::move(control)) {}

  int rank() const override { return data_->rank(); }
  int size() const override { return data_->size(); }
  DeviceType device_type() const override { return data_->device_type(); }
  int device_index() const override { return data_->device_index(); }
  std::string describe() const override { return data_->describe(); }
  std::chrono::milliseconds timeout() const override { return data_->timeout(); }

  void close() override {
    data_->close();
    control_->close();
  }

  void allreduce(const void* send, void* recv, size_t count, DType dtype, ReduceOp op, Stream stream) override {
    std::lock_guard<std::mutex> g(mu_);
    agree({OpKind::kAllreduce, dtype, static_cast<int64_t>(count), -1, op});
    data_->allreduce(send, recv, count, dtype, op, stream);
  }
  void reduce(const void* send, void* recv, size_t count, DType dtype, ReduceOp op, int root, Stream stream) override {
    std::lock_guard<std::mutex> g(mu_);
    agree({OpKind::kReduce, dtype, static_cast<int64_t>(count), root, op});
    data_->reduce(send, recv, count, dtype, op, root, stream);
  }
  void broadcast(void* buf, size_t count, DType dtype, int root, Stream stream) override {
    std::lock_guard<std::mutex> g(mu_);
    agree({OpKind::kBroadcast, dtype, static_cast<int64_t>(count), root});
    data_->broadcast(buf, count, dtype, root, stream);
  }
  void allgather(const void* send, void* recv, size_t count, DType dtype, Stream stream) override {
    std::lock_guard<std::mutex> g(mu_);
    agree({OpKind::kAllgather, dtype, static_cast<int64_t>(count)});
    data_->allgather(send, recv, count, dtype, stream);
  }
  void gather(const void* send, void* recv, size_t count, DType dtype, int root, Stream stream) override {
    std::lock_guard<std::mutex> g(mu_);
    agree({OpKind::kGather, dtype, static_cast<int64_t>(count), root});
    data_->gather(send, recv, count, dtype, root, stream);
  }
  void scatter(const void* send, void* recv, size_t count, DType dtype, int root, Stream stream) override {
    std::lock_guard<std::mutex> g(mu_);
    agree({OpKind::kScatter, dtype, static_cast<int64_t>(count), root});
    data_->scatter(send, recv, count, dtype, root, stream);
  }
  void reduce_scatter(const void* send, void* recv, size_t count, DType dtype, ReduceOp op, Stream stream) override {
    std::lock_guard<std::mutex> g(mu_);
    agree({OpKind::kReduceScatter, dtype, static_cast<int64_t>(count), -1, op});
    data_->reduce_scatter(send, recv, count, dtype, op, stream);
  }
  void alltoall(const void* send, void* recv, size_t count, DType dtype, Stream stream) override {
    std::lock_guard<std::mutex> g(mu_);
    agree({OpKind::kAlltoall, dtype, static_cast<int64_t>(count)});
    data_->alltoall(send, recv, count, dtype, stream);
  }
  void alltoall_v(const void* send, const std::vector<size_t>& send_counts, const std::vector<size_t>& send_displs,
                  void* recv, const std::vector<size_t>& recv_counts, const std::vector<size_t>& recv_displs,
                  DType dtype, Stream stream) override {
    std::lock_guard<std::mutex> g(mu_);
    OpDesc d{OpKind::kAlltoallV, dtype, 0};
    for (size_t c : send_counts) d.count += static_cast<int64_t>(c);
    const size_t n = static_cast<size_t>(size());
    if (send_counts.size() == n && recv_counts.size() == n) {
      const std::vector<int64_t> counts = encode_alltoallv_counts(send_counts, recv_counts);
      agree(d, &counts);
    } else {
      agree(d);  // the data communicator reports the bad argument, on this rank only
    }
    data_->alltoall_v(send, send_counts, send_displs, recv, recv_counts, recv_displs, dtype, stream);
  }
  void send(const void* buf, size_t count, DType dtype, int peer, Stream stream) override {
    std::lock_guard<std::mutex> g(mu_);
    check_not_broken();
    data_->send(buf, count, dtype, peer, stream);
  }
  void recv(void* buf, size_t count, DType dtype, int peer, Stream stream) override {
    std::lock_guard<std::mutex> g(mu_);
    check_not_broken();
    data_->recv(buf, count, dtype, peer, stream);
  }
  void barrier(Stream stream) override {
    std::lock_guard<std::mutex> g(mu_);
    agree({OpKind::kBarrier});
    data_->barrier(stream);
  }

  void expect_calls(const std::vector<OpDesc>& calls) override {
    for (const OpDesc& c : calls)
      if (c.kind == OpKind::kAlltoallV || c.kind == OpKind::kSend || c.kind == OpKind::kRecv)
        throw InvalidArgument(describe() + ": expect_calls: " + to_string(c) + " cannot be promised");
    std::lock_guard<std::mutex> g(mu_);
    if (size() == 1 || !agreed_.empty()) return;  // nothing to save, or still keeping a promise
    promised_ = calls;
  }

 private:
  void check_not_broken() const {
    if (!broken_.empty()) throw Error(describe() + ": communicator broken by an earlier failure: " + broken_);
  }

  // Requires mu_. Agrees on `d` over the control communicator (or keeps a
  // promise every rank made); throws before any data moves.
  void agree(const OpDesc& d, const std::vector<int64_t>* counts = nullptr) {
    check_not_broken();
    const uint64_t seq = seq_++;
    const int n = size();
    if (n == 1) return;
    if (!agreed_.empty()) {
      const OpDesc expected = agreed_.front();
      agreed_.pop_front();
      if (same_desc(expected, d)) return;
      agreed_.clear();
      broken_ = "this rank called " + to_string(d) + " where it had promised " + to_string(expected) +
                " (expect_calls) to its peers, who run the promised call without agreeing on it";
      throw Error(describe() + ": " + broken_);
    }
    std::vector<OpDesc> promised;
    promised.swap(promised_);
    const bool promising = !promised.empty() && same_desc(promised[0], d) && counts == nullptr;
    if (promising) promised.erase(promised.begin());
    const CallWire mine = encode_call(d, seq, promising ? announce(promised) : Announcement{});
    std::vector<int64_t> all(kCallWords * n);
    control_->agreement_allgather(mine.data(), kCallWords, all.data());
    std::string why = call_disagreement(all.data(), n, rank());
    if (why.empty() && promising && common_announcement(all.data(), n) > 0)
      agreed_.assign(promised.begin(), promised.end());
    if (why.empty() && counts != nullptr) {
      std::vector<int64_t> matrix(counts->size() * n);
      control_->agreement_allgather(counts->data(), counts->size(), matrix.data());
      why = alltoallv_disagreement(matrix.data(), n);
    }
    if (!why.empty()) throw MismatchError(describe() + ": ranks disagree: " + why);
  }

  CommunicatorPtr data_;
  CommunicatorPtr control_;
  std::mutex mu_;  // one call (agreement + data) at a time
  uint64_t seq_ = 0;
  std::vector<OpDesc> promised_;  // expect_calls(), sent with the next agreement
  std::deque<OpDesc> agreed_;     // promised by every rank: they run without agreement
  std::string broken_;
};

}  // namespace

CommunicatorPtr make_agreed_communicator(CommunicatorPtr data, CommunicatorPtr control) {
  if (!data || !control) throw InvalidArgument("make_agreed_communicator: communicator is null");
  if (data->rank() != control->rank() || data->size() != control->size())
    throw InvalidArgument("make_agreed_communicator: " + data->describe() + " is rank " + std::to_string(data->rank()) +
                          "/" + std::to_string(data->size()) + " but " + control->describe() + " is rank " +
                          std::to_string(control->rank()) + "/" + std::to_string(control->size()));
  return std::make_shared<AgreedCommunicator>(std::move(data), std::move(control));
}

}  // namespace bagua
