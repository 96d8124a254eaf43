// Communicator over NCCL on one CUDA device per rank.
//
// NCCL is opened at run time from an explicit path (nccl_library.h), so the
// module imports on hosts without a GPU. The communicator is non-blocking
// (ncclConfig_t.blocking = 0): its creation and every enqueue are polled
// against the timeout, and a watchdog thread follows each operation left
// running on a caller's stream. On a timeout or an asynchronous NCCL error the
// communicator is aborted (ncclCommAbort, never ncclCommDestroy on a failed
// communicator) and this and every later call throws bagua::TimeoutError or
// bagua::Error naming the operation and the communicator.
//
// Streams: every operation is enqueued on the caller's stream (a cudaStream_t
// passed as void*) and returns once enqueued; the caller synchronizes the
// stream before reading the results. A null stream selects the
// communicator's internal stream, which orders after work on the legacy
// default stream, and then the call waits (with the timeout) until the
// operation is complete. barrier() always waits.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <deque>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include <cuda_runtime_api.h>

#include "comm/call_checks.h"
#include "comm/communicator.h"
#include "comm/nccl/nccl_library.h"
#include "store/store.h"

namespace bagua {

struct NcclOptions {
  int device = 0;                                 // CUDA device index of this rank
  std::chrono::milliseconds timeout{600 * 1000};  // every blocking step and operation
  std::string library_path;                       // full path of libnccl.so.2
  // Use NCCL's own AVG when the library has it (>= 2.10); false computes AVG
  // as SUM followed by Bagua's divide kernel.
  bool native_avg = true;
};

class NcclCommunicator : public Communicator {
 public:
  // Collective over the `size` ranks: rank 0 creates NCCL's unique id and
  // publishes it in `store` under prefix + "/nccl_id", the others read it
  // (waiting up to the timeout). Use a fresh prefix per communicator. The
  // store is used only during construction.
  NcclCommunicator(Store& store, const std::string& prefix, int rank, int size, const NcclOptions& options);
  ~NcclCommunicator() override;

  NcclCommunicator(const NcclCommunicator&) = delete;
  NcclCommunicator& operator=(const NcclCommunicator&) = delete;

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  DeviceType device_type() const override { return DeviceType::kCUDA; }
  std::string describe() const override;
  std::chrono::milliseconds timeout() const override { return timeout_; }

  int device() const { return device_; }
  int device_index() const override { return device_; }
  // Stops the watchdog, then finalizes and destroys the NCCL communicator
  // (abort if that fails or outlasts the timeout) and frees its streams and
  // events; every later call throws bagua::Error. Idempotent.
  void close() override;
  int nccl_version() const { return lib_->version; }
  bool native_avg() const { return native_avg_; }

  void allreduce(const void* send, void* recv, size_t count, DType dtype, ReduceOp op,
                 Stream stream = nullptr) override;
  void reduce(const void* send, void* recv, size_t count, DType dtype, ReduceOp op, int root,
              Stream stream = nullptr) override;
  void broadcast(void* buf, size_t count, DType dtype, int root, Stream stream = nullptr) override;
  void allgather(const void* send, void* recv, size_t count, DType dtype, Stream stream = nullptr) override;
  void gather(const void* send, void* recv, size_t count, DType dtype, int root, Stream stream = nullptr) override;
  void scatter(const void* send, void* recv, size_t count, DType dtype, int root, Stream stream = nullptr) override;
  void reduce_scatter(const void* send, void* recv, size_t count, DType dtype, ReduceOp op,
                      Stream stream = nullptr) override;
  void alltoall(const void* send, void* recv, size_t count, DType dtype, Stream stream = nullptr) override;
  void alltoall_v(const void* send, const std::vector<size_t>& send_counts, const std::vector<size_t>& send_displs,
                  void* recv, const std::vector<size_t>& recv_counts, const std::vector<size_t>& recv_displs,
                  DType dtype, Stream stream = nullptr) override;
  void send(const void* buf, size_t count, DType dtype, int peer, Stream stream = nullptr) override;
  void recv(void* buf, size_t count, DType dtype, int peer, Stream stream = nullptr) override;
  void barrier(Stream stream = nullptr) override;

 private:
  using Clock = std::chrono::steady_clock;
  enum class FailureKind { kNone, kError, kTimeout };
  struct Pending {
    cudaEvent_t event;
    std::string op;
    Clock::time_point deadline;
  };

  // Enqueues `enqueue(stream)` (NCCL calls) under the comm lock, polls NCCL
  // until the work is enqueued, runs `after(stream)` (e.g. the AVG divide),
  // then waits for completion (null stream, or `wait`) or hands the operation
  // to the watchdog.
  template <typename Enqueue, typename After>
  void run(const char* op, Stream stream, bool wait, Enqueue&& enqueue, After&& after);
  template <typename Enqueue>
  void run(const char* op, Stream stream, Enqueue&& enqueue) {
    run(op, stream, false, std::forward<Enqueue>(enqueue), [](cudaStream_t) {});
  }

  // Requires comm_mu_. Polls ncclCommGetAsyncError while it says in-progress.
  void wait_ready_locked(const char* op, nccl::ncclResult_t first, Clock::time_point deadline);
  void wait_stream(const char* op, cudaStream_t stream, Clock::time_point deadline);
  // Requires comm_mu_. Aborts the NCCL communicator and records why (first reason wins).
  void abort_locked(FailureKind kind, const std::string& why);
  [[noreturn]] void throw_failure() const;
  void check_alive() const;
  [[noreturn]] void fail(FailureKind kind, const std::string& why);  // takes comm_mu_

  // comm/call_checks.h, then the memory must be this device's.
  void check_device_buffer(const CallChecks& check, const void* p, size_t count, const char* what) const;
  nccl::ncclRedOp_t nccl_op(ReduceOp op) const;  // SUM for AVG without native AVG
  void divide_if_avg(ReduceOp op, void* data, size_t count, DType dtype, cudaStream_t s) const;

  cudaEvent_t take_event();
  void recycle_event(cudaEvent_t e);
  void watch(const char* op, cudaStream_t stream);
  void watchdog_loop();
  void release_resources() noexcept;

  std::string prefix_;
  int rank_;
  int size_;
  int device_;
  std::chrono::milliseconds timeout_;
  std::shared_ptr<const nccl::Library> lib_;
  bool native_avg_ = true;

  std::mutex comm_mu_;  // guards comm_ and every NCCL call on it
  nccl::ncclComm_t comm_ = nullptr;

  mutable std::mutex failure_mu_;
  std::atomic<bool> failed_{false};
  FailureKind failure_kind_ = FailureKind::kNone;
  std::string failure_;

  cudaStream_t internal_stream_ = nullptr;
  float* barrier_buf_ = nullptr;

  std::mutex watch_mu_;  // guards pending_, free_events_, stop_
  std::condition_variable watch_cv_;
  std::deque<Pending> pending_;
  std::vector<cudaEvent_t> free_events_;
  bool stop_ = false;
  std::thread watchdog_;
  std::mutex close_mu_;  // close() once, from any thread
};

}  // namespace bagua
