#include "comm/nccl/nccl_communicator.h"

#include <algorithm>
#include <cstring>
#include <utility>

#include "comm/nccl/cuda_util.h"
#include "common/error.h"
#include "kernels/cuda_kernels.h"

namespace bagua {

using nccl::ncclInProgress;
using nccl::ncclResult_t;
using nccl::ncclSuccess;

namespace {

nccl::ncclDataType_t to_nccl(DType t) {
  switch (t) {
    case DType::kFloat32: return nccl::ncclFloat32;
    case DType::kFloat64: return nccl::ncclFloat64;
    case DType::kFloat16: return nccl::ncclFloat16;
    case DType::kBFloat16: return nccl::ncclBfloat16;
    case DType::kInt32: return nccl::ncclInt32;
    case DType::kInt64: return nccl::ncclInt64;
    case DType::kUInt8: return nccl::ncclUint8;
  }
  throw InvalidArgument("unknown dtype code " + std::to_string(static_cast<int>(t)));
}

// Spin briefly (most enqueues finish in microseconds), then sleep.
void backoff(int& spins) {
  ++spins;
  if (spins < 100) {
    std::this_thread::yield();
  } else {
    std::this_thread::sleep_for(std::chrono::microseconds(spins < 2000 ? 50 : 1000));
  }
}

constexpr std::chrono::milliseconds kWatchdogPeriod{20};

}  // namespace

std::string NcclCommunicator::describe() const {
  return "nccl group '" + prefix_ + "' rank " + std::to_string(rank_) + "/" + std::to_string(size_) +
         " on cuda:" + std::to_string(device_);
}

// ---------------------------------------------------------------------------
// Construction and teardown

NcclCommunicator::NcclCommunicator(Store& store, const std::string& prefix, int rank, int size,
                                   const NcclOptions& options)
    : prefix_(prefix), rank_(rank), size_(size), device_(options.device), timeout_(options.timeout) {
  if (size_ < 1) throw InvalidArgument("NCCL communicator size must be >= 1, got " + std::to_string(size_));
  if (rank_ < 0 || rank_ >= size_) {
    throw InvalidArgument("rank " + std::to_string(rank_) + " is out of range for size " + std::to_string(size_));
  }
  if (device_ < 0) throw InvalidArgument("CUDA device index must be >= 0, got " + std::to_string(device_));
  if (timeout_.count() <= 0) throw InvalidArgument("NCCL communicator timeout must be > 0");

  const int devices = cuda::device_count();
  if (devices == 0) {
    throw Error("cannot create " + describe() + ": no usable CUDA device: " + cuda::no_device_reason());
  }
  if (device_ >= devices) {
    throw InvalidArgument("cannot create " + describe() + ": only " + std::to_string(devices) +
                          " CUDA device(s) are visible");
  }
  lib_ = nccl::load_library(options.library_path);
  native_avg_ = options.native_avg && lib_->version >= nccl::kAvgVersion;

  cuda::DeviceGuard guard(device_);
  nccl::ncclUniqueId id;
  const std::string key = prefix_ + "/nccl_id";
  if (rank_ == 0) {
    ncclResult_t r = lib_->GetUniqueId(&id);
    if (r != ncclSuccess) throw Error(describe() + ": ncclGetUniqueId failed: " + lib_->describe_error(r));
    const auto* bytes = reinterpret_cast<const uint8_t*>(id.internal);
    store.set(key, std::vector<uint8_t>(bytes, bytes + sizeof(id.internal)));
  } else {
    std::vector<uint8_t> value;
    try {
      value = store.get(key, timeout_);
    } catch (const TimeoutError& e) {
      throw TimeoutError(describe() + ": rank 0 did not publish the NCCL id under '" + key + "' within " +
                         seconds(timeout_) + " (" + e.what() + ")");
    }
    if (value.size() != sizeof(id.internal)) {
      throw Error(describe() + ": the value under '" + key + "' has " + std::to_string(value.size()) +
                  " bytes, not an NCCL id of " + std::to_string(sizeof(id.internal)) +
                  " (is the prefix used by something else?)");
    }
    std::memcpy(id.internal, value.data(), value.size());
  }

  const auto deadline = Clock::now() + timeout_;
  nccl::ncclConfig_t config = nccl::default_config();
  config.blocking = 0;  // poll creation and every call against the timeout
  config.commName = prefix_.c_str();
  nccl::ncclComm_t comm = nullptr;
  ncclResult_t r = lib_->CommInitRankConfig(&comm, size_, id, rank_, &config);
  {
    std::lock_guard<std::mutex> lock(comm_mu_);
    comm_ = comm;
    wait_ready_locked("initialisation (do all ranks create this communicator with the same prefix?)", r, deadline);
  }
  try {
    cuda::check(cudaStreamCreateWithFlags(&internal_stream_, cudaStreamDefault), "cudaStreamCreate");
    cuda::check(cudaMalloc(reinterpret_cast<void**>(&barrier_buf_), sizeof(float)), "cudaMalloc");
    cuda::check(cudaMemset(barrier_buf_, 0, sizeof(float)), "cudaMemset");
    watchdog_ = std::thread([this] { watchdog_loop(); });
  } catch (...) {
    release_resources();
    throw;
  }
}

NcclCommunicator::~NcclCommunicator() { close(); }

void NcclCommunicator::close() {
  std::lock_guard<std::mutex> once(close_mu_);
  {
    std::lock_guard<std::mutex> lock(watch_mu_);
    stop_ = true;
  }
  watch_cv_.notify_all();
  if (watchdog_.joinable()) watchdog_.join();
  release_resources();  // comm_ becomes null: later calls say "is closed"
}

void NcclCommunicator::release_resources() noexcept {
  try {
    cuda::DeviceGuard guard(device_);
    std::lock_guard<std::mutex> lock(comm_mu_);
    if (comm_ != nullptr) {
      // Finalize flushes outstanding work; if it fails or stalls, abort.
      const auto deadline = Clock::now() + timeout_;
      ncclResult_t r = lib_->CommFinalize(comm_);
      bool ok = r == ncclSuccess || r == ncclInProgress;
      while (ok) {
        ncclResult_t state = ncclInProgress;
        if (lib_->CommGetAsyncError(comm_, &state) != ncclSuccess) state = nccl::ncclInternalError;
        if (state == ncclSuccess) break;
        if (state != ncclInProgress || Clock::now() > deadline)
          ok = false;
        else
          std::this_thread::sleep_for(std::chrono::milliseconds(1));
      }
      if (ok) {
        lib_->CommDestroy(comm_);
      } else {
        lib_->CommAbort(comm_);
      }
      comm_ = nullptr;
    }
  } catch (...) {
  }
  for (auto& p : pending_) cudaEventDestroy(p.event);
  pending_.clear();
  for (cudaEvent_t e : free_events_) cudaEventDestroy(e);
  free_events_.clear();
  if (internal_stream_ != nullptr) cudaStreamDestroy(internal_stream_);
  internal_stream_ = nullptr;
  if (barrier_buf_ != nullptr) cudaFree(barrier_buf_);
  barrier_buf_ = nullptr;
}

// ---------------------------------------------------------------------------
// Failure handling

void NcclCommunicator::abort_locked(FailureKind kind, const std::string& why) {
  {
    std::lock_guard<std::mutex> lock(failure_mu_);
    if (failure_kind_ == FailureKind::kNone) {
      failure_kind_ = kind;
      failure_ = why;
    }
  }
  failed_ = true;
  if (comm_ != nullptr) {
    lib_->CommAbort(comm_);  // frees the communicator; safe with work in flight
    comm_ = nullptr;
  }
}

void NcclCommunicator::throw_failure() const {
  std::lock_guard<std::mutex> lock(failure_mu_);
  if (failure_kind_ == FailureKind::kTimeout) throw TimeoutError(failure_);
  throw Error(failure_);
}

void NcclCommunicator::check_alive() const {
  if (!failed_) return;
  std::lock_guard<std::mutex> lock(failure_mu_);
  const std::string msg = describe() + " was aborted and cannot be used; cause: " + failure_;
  if (failure_kind_ == FailureKind::kTimeout) throw TimeoutError(msg);
  throw Error(msg);
}

void NcclCommunicator::fail(FailureKind kind, const std::string& why) {
  {
    std::lock_guard<std::mutex> lock(comm_mu_);
    abort_locked(kind, why);
  }
  throw_failure();
}

void NcclCommunicator::wait_ready_locked(const char* op, ncclResult_t first, Clock::time_point deadline) {
  if (first == ncclSuccess) return;
  if (first != ncclInProgress) {
    abort_locked(FailureKind::kError, describe() + ": NCCL " + op + " failed: " + lib_->describe_error(first, comm_));
    throw_failure();
  }
  int spins = 0;
  while (true) {
    ncclResult_t state = ncclInProgress;
    ncclResult_t q = lib_->CommGetAsyncError(comm_, &state);
    if (q != ncclSuccess) state = q;
    if (state == ncclSuccess) return;
    if (state != ncclInProgress) {
      abort_locked(FailureKind::kError, describe() + ": NCCL " + op + " failed: " + lib_->describe_error(state, comm_));
      throw_failure();
    }
    if (Clock::now() > deadline) {
      abort_locked(FailureKind::kTimeout, describe() + ": NCCL " + op + " did not complete within " +
                                              seconds(timeout_) + "; the communicator was aborted");
      throw_failure();
    }
    backoff(spins);
  }
}

void NcclCommunicator::wait_stream(const char* op, cudaStream_t stream, Clock::time_point deadline) {
  cudaEvent_t event = take_event();
  cudaError_t err = cudaEventRecord(event, stream);
  if (err != cudaSuccess) {
    recycle_event(event);
    cuda::check(err, describe() + ": cudaEventRecord after " + op);
  }
  int spins = 0;
  while (true) {
    cudaError_t q = cudaEventQuery(event);
    if (q == cudaSuccess) {
      recycle_event(event);
      return;
    }
    if (q != cudaErrorNotReady) {
      cudaEventDestroy(event);
      fail(FailureKind::kError, describe() + ": CUDA error while waiting for NCCL " + op + ": " + cuda::error_text(q));
    }
    if (failed_) {  // the watchdog aborted the communicator meanwhile
      cudaEventDestroy(event);
      check_alive();
    }
    if (Clock::now() > deadline) {
      cudaEventDestroy(event);
      fail(FailureKind::kTimeout, describe() + ": NCCL " + op + " did not complete within " + seconds(timeout_) +
                                      "; the communicator was aborted");
    }
    if (spins >= 100) {  // past the fast path: also watch for asynchronous NCCL errors
      std::lock_guard<std::mutex> lock(comm_mu_);
      ncclResult_t state = ncclSuccess;
      if (comm_ != nullptr && lib_->CommGetAsyncError(comm_, &state) == ncclSuccess && state != ncclSuccess &&
          state != ncclInProgress) {
        cudaEventDestroy(event);
        abort_locked(FailureKind::kError,
                     describe() + ": NCCL " + op + " failed: " + lib_->describe_error(state, comm_));
        throw_failure();
      }
    }
    backoff(spins);
  }
}

// ---------------------------------------------------------------------------
// Watchdog: follows operations left running on callers' streams.

cudaEvent_t NcclCommunicator::take_event() {
  {
    std::lock_guard<std::mutex> lock(watch_mu_);
    if (!free_events_.empty()) {
      cudaEvent_t e = free_events_.back();
      free_events_.pop_back();
      return e;
    }
  }
  cudaEvent_t e = nullptr;
  cuda::check(cudaEventCreateWithFlags(&e, cudaEventDisableTiming), describe() + ": cudaEventCreate");
  return e;
}

void NcclCommunicator::recycle_event(cudaEvent_t e) {
  std::lock_guard<std::mutex> lock(watch_mu_);
  free_events_.push_back(e);
}

void NcclCommunicator::watch(const char* op, cudaStream_t stream) {
  cudaEvent_t event = take_event();
  cudaError_t err = cudaEventRecord(event, stream);
  if (err != cudaSuccess) {
    recycle_event(event);
    cuda::check(err, describe() + ": cudaEventRecord after " + op);
  }
  {
    std::lock_guard<std::mutex> lock(watch_mu_);
    pending_.push_back(Pending{event, op, Clock::now() + timeout_});
  }
  watch_cv_.notify_one();
}

void NcclCommunicator::watchdog_loop() {
  cudaSetDevice(device_);
  std::unique_lock<std::mutex> lock(watch_mu_);
  while (!stop_) {
    if (pending_.empty()) {
      watch_cv_.wait(lock, [this] { return stop_ || !pending_.empty(); });
    } else {
      watch_cv_.wait_for(lock, kWatchdogPeriod, [this] { return stop_; });
    }
    if (stop_) break;

    // Entries are in enqueue order, so the front has the earliest deadline.
    FailureKind kind = FailureKind::kNone;
    std::string why;
    while (!pending_.empty()) {
      Pending& front = pending_.front();
      cudaError_t q = cudaEventQuery(front.event);
      if (q == cudaSuccess) {
        free_events_.push_back(front.event);
        pending_.pop_front();
        continue;
      }
      if (q != cudaErrorNotReady) {
        kind = FailureKind::kError;
        why = describe() + ": CUDA error during NCCL " + front.op + ": " + cuda::error_text(q);
      } else if (Clock::now() > front.deadline) {
        kind = FailureKind::kTimeout;
        why = describe() + ": NCCL " + front.op + " did not complete within " + seconds(timeout_) +
              " (a rank missing or stuck?); the communicator was aborted";
      }
      break;
    }
    const std::string oldest = pending_.empty() ? std::string() : pending_.front().op;
    if (oldest.empty()) continue;
    lock.unlock();
    {
      // A caller polling an enqueue holds comm_mu_ at most until its own
      // deadline; for a plain error check, do not wait behind it.
      std::unique_lock<std::mutex> comm_lock(comm_mu_, std::defer_lock);
      if (kind != FailureKind::kNone) {
        comm_lock.lock();
      } else {
        comm_lock.try_lock();
      }
      if (comm_lock.owns_lock() && comm_ != nullptr) {
        ncclResult_t state = ncclSuccess;
        if (kind == FailureKind::kNone && lib_->CommGetAsyncError(comm_, &state) == ncclSuccess &&
            state != ncclSuccess && state != ncclInProgress) {
          kind = FailureKind::kError;
          why = describe() + ": asynchronous NCCL error during " + oldest + ": " + lib_->describe_error(state, comm_) +
                "; the communicator was aborted";
        }
        if (kind != FailureKind::kNone) abort_locked(kind, why);
      }
    }
    lock.lock();
    if (failed_) {
      // Aborted: the kernels are gone and nobody waits for these events.
      for (auto& p : pending_) cudaEventDestroy(p.event);
      pending_.clear();
    }
  }
}

// ---------------------------------------------------------------------------
// Operations

template <typename Enqueue, typename After>
void NcclCommunicator::run(const char* op, Stream stream, bool wait, Enqueue&& enqueue, After&& after) {
  check_alive();
  cuda::DeviceGuard guard(device_);
  cudaStream_t s = stream != nullptr ? static_cast<cudaStream_t>(stream) : internal_stream_;
  const auto deadline = Clock::now() + timeout_;
  {
    std::lock_guard<std::mutex> lock(comm_mu_);
    if (comm_ == nullptr) {
      check_alive();
      throw Error(describe() + " is closed");
    }
    ncclResult_t r = enqueue(s);
    wait_ready_locked(op, r, deadline);
  }
  after(s);  // NCCL's state is ready: other work may now go on the stream
  if (wait || stream == nullptr) {
    wait_stream(op, s, deadline);
  } else {
    watch(op, s);
  }
}

// The shared checks, then what only NCCL needs: host memory in an NCCL kernel
// would corrupt the CUDA context, so memory known to be wrong is refused.
// Memory CUDA cannot classify (an error here) is left to NCCL, so unusual
// allocators are not refused.
void NcclCommunicator::check_device_buffer(const CallChecks& check, const void* p, size_t count,
                                           const char* what) const {
  check.buffer(p, count, what);
  if (count == 0) return;
  cudaPointerAttributes attr;
  cudaError_t err = cudaPointerGetAttributes(&attr, p);
  if (err != cudaSuccess) {
    cudaGetLastError();
    return;
  }
  switch (attr.type) {
    case cudaMemoryTypeDevice:
      if (attr.device >= 0 && attr.device != device_) {
        check.invalid(std::string(what) + " lives on cuda:" + std::to_string(attr.device) +
                      ", not on the communicator's device cuda:" + std::to_string(device_));
      }
      return;
    case cudaMemoryTypeManaged: return;
    default:
      check.invalid(std::string(what) + " is host memory; NCCL needs device memory on cuda:" + std::to_string(device_));
  }
}

nccl::ncclRedOp_t NcclCommunicator::nccl_op(ReduceOp op) const {
  switch (op) {
    case ReduceOp::kSum: return nccl::ncclSum;
    case ReduceOp::kProd: return nccl::ncclProd;
    case ReduceOp::kMin: return nccl::ncclMin;
    case ReduceOp::kMax: return nccl::ncclMax;
    case ReduceOp::kAvg: return native_avg_ ? nccl::ncclAvg : nccl::ncclSum;
    case ReduceOp::kBor:
    case ReduceOp::kBand:
    case ReduceOp::kBxor:
      throw InvalidArgument(describe() + ": NCCL has no " + reduce_op_name(op) +
                            " reduction (bitwise reductions run on Gloo groups)");
  }
  throw InvalidArgument(describe() + ": unknown reduce op code " + std::to_string(static_cast<int>(op)));
}

void NcclCommunicator::divide_if_avg(ReduceOp op, void* data, size_t count, DType dtype, cudaStream_t s) const {
  if (op == ReduceOp::kAvg && !native_avg_ && size_ > 1) {
    cuda::launch_divide(data, count, dtype, static_cast<double>(size_), s);
  }
}

void NcclCommunicator::allreduce(const void* send, void* recv, size_t count, DType dtype, ReduceOp op, Stream stream) {
  const OpDesc d{OpKind::kAllreduce, dtype, static_cast<int64_t>(count), -1, op};
  const CallChecks check(*this, d);
  check.dtype();
  const nccl::ncclRedOp_t nop = nccl_op(op);
  if (count == 0) return;
  check_device_buffer(check, send, count, "send buffer");
  check_device_buffer(check, recv, count, "recv buffer");
  run(
      "allreduce", stream, false,
      [&](cudaStream_t s) { return lib_->AllReduce(send, recv, count, to_nccl(dtype), nop, comm_, s); },
      [&](cudaStream_t s) { divide_if_avg(op, recv, count, dtype, s); });
}

void NcclCommunicator::reduce(const void* send, void* recv, size_t count, DType dtype, ReduceOp op, int root,
                              Stream stream) {
  const OpDesc d{OpKind::kReduce, dtype, static_cast<int64_t>(count), root, op};
  const CallChecks check(*this, d);
  check.dtype();
  check.root();
  const nccl::ncclRedOp_t nop = nccl_op(op);
  if (count == 0) return;
  check_device_buffer(check, send, count, "send buffer");
  if (rank_ == root) check_device_buffer(check, recv, count, "recv buffer");
  run(
      "reduce", stream, false,
      [&](cudaStream_t s) { return lib_->Reduce(send, recv, count, to_nccl(dtype), nop, root, comm_, s); },
      [&](cudaStream_t s) {
        if (rank_ == root) divide_if_avg(op, recv, count, dtype, s);
      });
}

void NcclCommunicator::broadcast(void* buf, size_t count, DType dtype, int root, Stream stream) {
  const OpDesc d{OpKind::kBroadcast, dtype, static_cast<int64_t>(count), root};
  const CallChecks check(*this, d);
  check.dtype();
  check.root();
  if (count == 0) return;
  check_device_buffer(check, buf, count, "buffer");
  run("broadcast", stream,
      [&](cudaStream_t s) { return lib_->Broadcast(buf, buf, count, to_nccl(dtype), root, comm_, s); });
}

void NcclCommunicator::allgather(const void* send, void* recv, size_t count, DType dtype, Stream stream) {
  const OpDesc d{OpKind::kAllgather, dtype, static_cast<int64_t>(count), -1};
  const CallChecks check(*this, d);
  check.dtype();
  if (count == 0) return;
  check_device_buffer(check, send, count, "send buffer");
  check_device_buffer(check, recv, count * size_, "recv buffer");
  run("allgather", stream,
      [&](cudaStream_t s) { return lib_->AllGather(send, recv, count, to_nccl(dtype), comm_, s); });
}

void NcclCommunicator::reduce_scatter(const void* send, void* recv, size_t count, DType dtype, ReduceOp op,
                                      Stream stream) {
  const OpDesc d{OpKind::kReduceScatter, dtype, static_cast<int64_t>(count), -1, op};
  const CallChecks check(*this, d);
  check.dtype();
  const nccl::ncclRedOp_t nop = nccl_op(op);
  if (count == 0) return;
  check_device_buffer(check, send, count * size_, "send buffer");
  check_device_buffer(check, recv, count, "recv buffer");
  run(
      "reduce_scatter", stream, false,
      [&](cudaStream_t s) { return lib_->ReduceScatter(send, recv, count, to_nccl(dtype), nop, comm_, s); },
      [&](cudaStream_t s) { divide_if_avg(op, recv, count, dtype, s); });
}

namespace {

// Issues `body` (sends and receives) as one NCCL group. The group is always
// closed, even after a failed call inside it.
template <typename Body>
ncclResult_t grouped(const nccl::Library& lib, Body&& body) {
  ncclResult_t r = lib.GroupStart();
  if (r != ncclSuccess) return r;
  ncclResult_t first = body();
  ncclResult_t end = lib.GroupEnd();
  return (first != ncclSuccess && first != ncclInProgress) ? first : end;
}

// Keeps the first real error among a group's calls.
void keep_first(ncclResult_t& first, ncclResult_t r) {
  if ((first == ncclSuccess || first == ncclInProgress) && r != ncclSuccess) first = r;
}

void copy_on_stream(void* dst, const void* src, size_t bytes, cudaStream_t s, const std::string& what) {
  if (bytes == 0 || dst == src) return;
  cuda::check(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, s), what);
}

}  // namespace

void NcclCommunicator::gather(const void* send, void* recv, size_t count, DType dtype, int root, Stream stream) {
  const OpDesc d{OpKind::kGather, dtype, static_cast<int64_t>(count), root};
  const CallChecks check(*this, d);
  check.dtype();
  check.root();
  if (count == 0) return;
  check_device_buffer(check, send, count, "send buffer");
  if (rank_ == root) check_device_buffer(check, recv, count * size_, "recv buffer");
  const size_t bytes = count * dtype_size(dtype);
  const auto dt = to_nccl(dtype);
  run(
      "gather", stream, false,
      [&](cudaStream_t s) {
        return grouped(*lib_, [&] {
          ncclResult_t first = ncclSuccess;
          if (rank_ == root) {
            for (int r = 0; r < size_; ++r) {
              if (r != root)
                keep_first(first, lib_->Recv(static_cast<char*>(recv) + r * bytes, count, dt, r, comm_, s));
            }
          } else {
            keep_first(first, lib_->Send(send, count, dt, root, comm_, s));
          }
          return first;
        });
      },
      [&](cudaStream_t s) {
        if (rank_ == root) {
          copy_on_stream(static_cast<char*>(recv) + root * bytes, send, bytes, s, describe() + ": gather copy");
        }
      });
}

void NcclCommunicator::scatter(const void* send, void* recv, size_t count, DType dtype, int root, Stream stream) {
  const OpDesc d{OpKind::kScatter, dtype, static_cast<int64_t>(count), root};
  const CallChecks check(*this, d);
  check.dtype();
  check.root();
  if (count == 0) return;
  if (rank_ == root) check_device_buffer(check, send, count * size_, "send buffer");
  check_device_buffer(check, recv, count, "recv buffer");
  const size_t bytes = count * dtype_size(dtype);
  const auto dt = to_nccl(dtype);
  run(
      "scatter", stream, false,
      [&](cudaStream_t s) {
        return grouped(*lib_, [&] {
          ncclResult_t first = ncclSuccess;
          if (rank_ == root) {
            for (int r = 0; r < size_; ++r) {
              if (r != root)
                keep_first(first, lib_->Send(static_cast<const char*>(send) + r * bytes, count, dt, r, comm_, s));
            }
          } else {
            keep_first(first, lib_->Recv(recv, count, dt, root, comm_, s));
          }
          return first;
        });
      },
      [&](cudaStream_t s) {
        if (rank_ == root) {
          copy_on_stream(recv, static_cast<const char*>(send) + root * bytes, bytes, s, describe() + ": scatter copy");
        }
      });
}

void NcclCommunicator::alltoall(const void* send, void* recv, size_t count, DType dtype, Stream stream) {
  const OpDesc d{OpKind::kAlltoall, dtype, static_cast<int64_t>(count), -1};
  const CallChecks check(*this, d);
  check.dtype();
  if (count == 0) return;
  check_device_buffer(check, send, count * size_, "send buffer");
  check_device_buffer(check, recv, count * size_, "recv buffer");
  if (send == recv && size_ > 1) throw InvalidArgument(describe() + ": alltoall cannot run in place");
  const size_t bytes = count * dtype_size(dtype);
  const auto dt = to_nccl(dtype);
  run(
      "alltoall", stream, false,
      [&](cudaStream_t s) {
        return grouped(*lib_, [&] {
          ncclResult_t first = ncclSuccess;
          for (int r = 0; r < size_; ++r) {
            if (r == rank_) continue;
            keep_first(first, lib_->Send(static_cast<const char*>(send) + r * bytes, count, dt, r, comm_, s));
            keep_first(first, lib_->Recv(static_cast<char*>(recv) + r * bytes, count, dt, r, comm_, s));
          }
          return first;
        });
      },
      [&](cudaStream_t s) {
        copy_on_stream(static_cast<char*>(recv) + rank_ * bytes, static_cast<const char*>(send) + rank_ * bytes, bytes,
                       s, describe() + ": alltoall copy");
      });
}

void NcclCommunicator::alltoall_v(const void* send, const std::vector<size_t>& send_counts,
                                  const std::vector<size_t>& send_displs, void* recv,
                                  const std::vector<size_t>& recv_counts, const std::vector<size_t>& recv_displs,
                                  DType dtype, Stream stream) {
  const OpDesc d{OpKind::kAlltoallV, dtype, 0, -1};
  const CallChecks check(*this, d);
  check.dtype();
  const size_t send_total = check.layout(send, send_counts, send_displs, "send");
  const size_t recv_total = check.layout(recv, recv_counts, recv_displs, "recv");
  if (send_counts[rank_] != recv_counts[rank_])
    check.invalid("send_counts[" + std::to_string(rank_) + "]=" + std::to_string(send_counts[rank_]) +
                  " differs from recv_counts[" + std::to_string(rank_) + "]=" + std::to_string(recv_counts[rank_]));
  if (send_total == 0 && recv_total == 0) return;
  check_device_buffer(check, send, send_total, "send buffer");
  check_device_buffer(check, recv, recv_total, "recv buffer");
  const size_t esize = dtype_size(dtype);
  const auto dt = to_nccl(dtype);
  run(
      "alltoall_v", stream, false,
      [&](cudaStream_t s) {
        return grouped(*lib_, [&] {
          ncclResult_t first = ncclSuccess;
          for (int r = 0; r < size_; ++r) {
            if (r == rank_) continue;
            if (send_counts[r] > 0) {
              keep_first(first, lib_->Send(static_cast<const char*>(send) + send_displs[r] * esize, send_counts[r], dt,
                                           r, comm_, s));
            }
            if (recv_counts[r] > 0) {
              keep_first(first, lib_->Recv(static_cast<char*>(recv) + recv_displs[r] * esize, recv_counts[r], dt, r,
                                           comm_, s));
            }
          }
          return first;
        });
      },
      [&](cudaStream_t s) {
        copy_on_stream(static_cast<char*>(recv) + recv_displs[rank_] * esize,
                       static_cast<const char*>(send) + send_displs[rank_] * esize, send_counts[rank_] * esize, s,
                       describe() + ": alltoall_v copy");
      });
}

void NcclCommunicator::send(const void* buf, size_t count, DType dtype, int peer, Stream stream) {
  const OpDesc d{OpKind::kSend, dtype, static_cast<int64_t>(count), peer};
  const CallChecks check(*this, d);
  check.dtype();
  check.peer();
  if (count == 0) return;
  check_device_buffer(check, buf, count, "buffer");
  run("send", stream, [&](cudaStream_t s) { return lib_->Send(buf, count, to_nccl(dtype), peer, comm_, s); });
}

void NcclCommunicator::recv(void* buf, size_t count, DType dtype, int peer, Stream stream) {
  const OpDesc d{OpKind::kRecv, dtype, static_cast<int64_t>(count), peer};
  const CallChecks check(*this, d);
  check.dtype();
  check.peer();
  if (count == 0) return;
  check_device_buffer(check, buf, count, "buffer");
  run("recv", stream, [&](cudaStream_t s) { return lib_->Recv(buf, count, to_nccl(dtype), peer, comm_, s); });
}

void NcclCommunicator::barrier(Stream stream) {
  run(
      "barrier", stream, true,
      [&](cudaStream_t s) {
        return lib_->AllReduce(barrier_buf_, barrier_buf_, 1, nccl::ncclFloat32, nccl::ncclSum, comm_, s);
      },
      [](cudaStream_t) {});
}

}  // namespace bagua
