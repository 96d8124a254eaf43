#include "comm/staged_communicator.h"

#include <algorithm>
#include <numeric>

#include "common/error.h"

namespace bagua {
namespace {

class StagedCommunicator : public Communicator {
 public:
  StagedCommunicator(CommunicatorPtr inner, DevicePtr device) : inner_(std::move(inner)), device_(std::move(device)) {
    if (!inner_) throw InvalidArgument("staged communicator: no communicator");
    if (!device_) throw InvalidArgument("staged communicator: no device");
    if (inner_->device_type() != DeviceType::kCPU)
      throw InvalidArgument("staged communicator: " + inner_->describe() + " is not a host communicator");
  }

  int rank() const override { return inner_->rank(); }
  int size() const override { return inner_->size(); }
  DeviceType device_type() const override { return device_->type(); }
  std::string describe() const override {
    return inner_->describe() + " staging " + device_->describe() + " memory through the host";
  }
  std::chrono::milliseconds timeout() const override { return inner_->timeout(); }
  void close() override { inner_->close(); }
  void expect_calls(const std::vector<OpDesc>& calls) override { inner_->expect_calls(calls); }
  void agreement_allgather(const int64_t* words, size_t n, int64_t* all) override {
    inner_->agreement_allgather(words, n, all);
  }

  void allreduce(const void* send, void* recv, size_t count, DType dtype, ReduceOp op, Stream stream) override {
    const size_t n = count * dtype_size(dtype);
    void* h = in(0, send, n, stream);
    begin(stream);
    inner_->allreduce(h, host_out(h, recv), count, dtype, op);
    out(recv, h, n, stream);
  }

  void reduce(const void* send, void* recv, size_t count, DType dtype, ReduceOp op, int root, Stream stream) override {
    const size_t n = count * dtype_size(dtype);
    void* h = in(0, send, n, stream);
    void* r = (rank() == root && recv) ? slot(1, n, recv) : nullptr;
    begin(stream);
    inner_->reduce(h, r, count, dtype, op, root);
    if (r) out(recv, r, n, stream);
  }

  void broadcast(void* buf, size_t count, DType dtype, int root, Stream stream) override {
    const size_t n = count * dtype_size(dtype);
    void* h = in(0, buf, n, stream);
    begin(stream);
    inner_->broadcast(h, count, dtype, root);
    out(buf, h, n, stream);
  }

  void allgather(const void* send, void* recv, size_t count, DType dtype, Stream stream) override {
    const size_t n = count * dtype_size(dtype);
    void* all = slot(1, n * size(), recv);
    void* mine = static_cast<char*>(all) + n * rank();
    copy_in(mine, send, n, stream);
    begin(stream);
    inner_->allgather(mine, all, count, dtype);
    out(recv, all, n * size(), stream);
  }

  void gather(const void* send, void* recv, size_t count, DType dtype, int root, Stream stream) override {
    const size_t n = count * dtype_size(dtype);
    void* h = in(0, send, n, stream);
    void* r = (rank() == root && recv) ? slot(1, n * size(), recv) : nullptr;
    begin(stream);
    inner_->gather(h, r, count, dtype, root);
    if (r) out(recv, r, n * size(), stream);
  }

  void scatter(const void* send, void* recv, size_t count, DType dtype, int root, Stream stream) override {
    const size_t n = count * dtype_size(dtype);
    void* h = (rank() == root && send) ? in(0, send, n * size(), stream) : nullptr;
    void* r = slot(1, n, recv);
    begin(stream);
    inner_->scatter(h, r, count, dtype, root);
    out(recv, r, n, stream);
  }

  void reduce_scatter(const void* send, void* recv, size_t count, DType dtype, ReduceOp op, Stream stream) override {
    const size_t n = count * dtype_size(dtype);
    void* h = in(0, send, n * size(), stream);
    void* r = slot(1, n, recv);
    begin(stream);
    inner_->reduce_scatter(h, r, count, dtype, op);
    out(recv, r, n, stream);
  }

  void alltoall(const void* send, void* recv, size_t count, DType dtype, Stream stream) override {
    const size_t n = count * dtype_size(dtype) * size();
    void* h = in(0, send, n, stream);
    void* r = slot(1, n, recv);
    begin(stream);
    inner_->alltoall(h, r, count, dtype);
    out(recv, r, n, stream);
  }

  void alltoall_v(const void* send, const std::vector<size_t>& send_counts, const std::vector<size_t>& send_displs,
                  void* recv, const std::vector<size_t>& recv_counts, const std::vector<size_t>& recv_displs,
                  DType dtype, Stream stream) override {
    const size_t es = dtype_size(dtype);
    const size_t sn = extent(send_counts, send_displs) * es;
    const size_t rn = extent(recv_counts, recv_displs) * es;
    void* h = in(0, send, sn, stream);
    void* r = slot(1, rn, recv);
    // the gaps between the receiver's chunks keep their bytes, as without staging
    copy_in(r, recv, rn, stream);
    begin(stream);
    inner_->alltoall_v(h, send_counts, send_displs, r, recv_counts, recv_displs, dtype);
    out(recv, r, rn, stream);
  }

  void send(const void* buf, size_t count, DType dtype, int peer, Stream stream) override {
    void* h = in(0, buf, count * dtype_size(dtype), stream);
    begin(stream);
    inner_->send(h, count, dtype, peer);
  }

  void recv(void* buf, size_t count, DType dtype, int peer, Stream stream) override {
    const size_t n = count * dtype_size(dtype);
    void* r = slot(1, n, buf);
    begin(stream);
    inner_->recv(r, count, dtype, peer);
    out(buf, r, n, stream);
  }

  void barrier(Stream stream) override {
    begin(stream);
    inner_->barrier();
  }

 private:
  bool staging() const { return !device_->host_accessible(); }

  // Host memory standing for `device_ptr` (nbytes): staging slot `k`, or the
  // memory itself on a host-accessible device.
  void* slot(int k, size_t nbytes, const void* device_ptr) {
    if (!staging() || device_ptr == nullptr) return const_cast<void*>(device_ptr);
    Stage& s = stages_[k];
    if (s.nbytes < nbytes) {
      s.memory = device_->allocate_pinned(nbytes);
      s.nbytes = nbytes;
    }
    return s.memory.get();
  }
  void* in(int k, const void* device_ptr, size_t nbytes, Stream stream) {
    void* h = slot(k, nbytes, device_ptr);
    copy_in(h, device_ptr, nbytes, stream);
    return h;
  }
  void copy_in(void* host, const void* device_ptr, size_t nbytes, Stream stream) {
    if (staging() && device_ptr && nbytes) device_->copy_async(host, device_ptr, nbytes, stream);
  }
  // Where the result of an in-place-staged call goes on the host.
  void* host_out(void* staged_in, void* recv) { return staging() ? staged_in : recv; }
  void out(void* device_ptr, const void* host, size_t nbytes, Stream stream) {
    if (staging() && device_ptr && nbytes) device_->copy_async(device_ptr, host, nbytes, stream);
  }
  // The stream's earlier work (and the copies in) are done: the host may read.
  void begin(Stream stream) { device_->synchronize(stream, inner_->timeout()); }

  static size_t extent(const std::vector<size_t>& counts, const std::vector<size_t>& displs) {
    size_t e = 0;
    for (size_t i = 0; i < counts.size() && i < displs.size(); ++i)
      if (counts[i]) e = std::max(e, displs[i] + counts[i]);
    return e;
  }

  struct Stage {
    std::shared_ptr<void> memory;
    size_t nbytes = 0;
  };

  CommunicatorPtr inner_;
  DevicePtr device_;
  Stage stages_[2];
};

}  // namespace

CommunicatorPtr make_staged_communicator(CommunicatorPtr host_comm, DevicePtr device) {
  return std::make_shared<StagedCommunicator>(std::move(host_comm), std::move(device));
}

}  // namespace bagua
