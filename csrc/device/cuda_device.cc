// The CUDA implementation of Device (device/device.h). Compiled in every
// build; without CUDA the factory says so.
#include "device/device.h"

#include <functional>
#include <memory>

#include "common/error.h"

#ifdef BAGUA_WITH_CUDA
#include <algorithm>
#include <cstring>
#include <mutex>
#include <thread>
#include <vector>

#include <cuda_runtime_api.h>

#include "comm/nccl/cuda_util.h"
#endif

namespace bagua {

#ifdef BAGUA_WITH_CUDA
namespace {

class CudaEvent : public DeviceEvent {
 public:
  explicit CudaEvent(int device) : device_(device) {
    cuda::DeviceGuard guard(device_);
    cuda::check(cudaEventCreateWithFlags(&event, cudaEventDisableTiming), "cudaEventCreate");
  }
  ~CudaEvent() override { cudaEventDestroy(event); }
  cudaEvent_t event = nullptr;

 private:
  int device_;
};

cudaEvent_t event_of(const DeviceEventPtr& event) {
  auto* e = dynamic_cast<CudaEvent*>(event.get());
  if (!e) throw InvalidArgument("CUDA device: the event is missing or belongs to another device");
  return e->event;
}

// Polls `query` (cudaEventQuery / cudaStreamQuery) until it is not
// cudaErrorNotReady, or throws TimeoutError after `timeout`.
template <typename Query>
void poll(Query query, std::chrono::milliseconds timeout, const std::string& what) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  auto pause = std::chrono::microseconds(2);
  for (;;) {
    cudaError_t err = query();
    if (err == cudaSuccess) return;
    if (err != cudaErrorNotReady) cuda::check(err, what);
    if (std::chrono::steady_clock::now() >= deadline)
      throw TimeoutError(what + ": not complete within " + seconds(timeout));
    std::this_thread::sleep_for(pause);
    pause = std::min(pause * 2, std::chrono::microseconds(500));
  }
}

void run_host_function(void* arg) {
  std::unique_ptr<std::function<void()>> fn(static_cast<std::function<void()>*>(arg));
  (*fn)();  // host functions cannot report errors: callers keep theirs noexcept
}

class CudaDevice : public Device {
 public:
  explicit CudaDevice(int index) : index_(index) {}
  ~CudaDevice() override {
    for (cudaStream_t s : streams_) cudaStreamDestroy(s);
  }

  DeviceType type() const override { return DeviceType::kCUDA; }
  int index() const override { return index_; }
  std::string describe() const override { return "cuda:" + std::to_string(index_); }

  std::shared_ptr<void> allocate(size_t nbytes) override {
    cuda::DeviceGuard guard(index_);
    void* p = nullptr;
    cuda::check(cudaMalloc(&p, nbytes == 0 ? 1 : nbytes), "cudaMalloc(" + std::to_string(nbytes) + " bytes)");
    cudaError_t err = cudaMemset(p, 0, nbytes);
    // cudaMemset runs on the legacy default stream, which non-blocking streams
    // (XLA's, the lanes') do not wait for: finish it before handing out the memory
    if (err == cudaSuccess) err = cudaStreamSynchronize(cudaStreamLegacy);
    if (err != cudaSuccess) {
      cudaFree(p);
      cuda::check(err, "cudaMemset");
    }
    DevicePtr self = shared_from_this();
    return std::shared_ptr<void>(p, [self](void* q) { cudaFree(q); });
  }

  std::shared_ptr<void> allocate_pinned(size_t nbytes) override {
    cuda::DeviceGuard guard(index_);
    void* p = nullptr;
    cuda::check(cudaMallocHost(&p, nbytes == 0 ? 1 : nbytes), "cudaMallocHost(" + std::to_string(nbytes) + " bytes)");
    std::memset(p, 0, nbytes);
    DevicePtr self = shared_from_this();
    return std::shared_ptr<void>(p, [self](void* q) { cudaFreeHost(q); });
  }

  Stream new_stream() override {
    cuda::DeviceGuard guard(index_);
    cudaStream_t s = nullptr;
    cuda::check(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), "cudaStreamCreate");
    std::lock_guard<std::mutex> lock(mu_);
    streams_.push_back(s);
    return s;
  }

  void copy_async(void* dst, const void* src, size_t nbytes, Stream stream) override {
    if (nbytes == 0 || dst == src) return;
    cuda::check(cudaMemcpyAsync(dst, src, nbytes, cudaMemcpyDefault, stream_of(stream)), "cudaMemcpyAsync");
  }
  void memset_async(void* dst, int value, size_t nbytes, Stream stream) override {
    if (nbytes == 0) return;
    cuda::check(cudaMemsetAsync(dst, value, nbytes, stream_of(stream)), "cudaMemsetAsync");
  }
  void enqueue_host(Stream stream, std::function<void()> fn) override {
    auto* arg = new std::function<void()>(std::move(fn));
    cudaError_t err = cudaLaunchHostFunc(stream_of(stream), run_host_function, arg);
    if (err != cudaSuccess) {
      delete arg;
      cuda::check(err, "cudaLaunchHostFunc");
    }
  }

  DeviceEventPtr new_event() override { return std::make_shared<CudaEvent>(index_); }
  void record(const DeviceEventPtr& event, Stream stream) override {
    cuda::check(cudaEventRecord(event_of(event), stream_of(stream)), "cudaEventRecord");
  }
  void wait(Stream stream, const DeviceEventPtr& event) override {
    cuda::check(cudaStreamWaitEvent(stream_of(stream), event_of(event), 0), "cudaStreamWaitEvent");
  }
  void synchronize(const DeviceEventPtr& event, std::chrono::milliseconds timeout) override {
    cudaEvent_t e = event_of(event);
    poll([e] { return cudaEventQuery(e); }, timeout, "waiting for a CUDA event on " + describe());
  }
  void synchronize(Stream stream, std::chrono::milliseconds timeout) override {
    cudaStream_t s = stream_of(stream);
    poll([s] { return cudaStreamQuery(s); }, timeout, "waiting for a CUDA stream on " + describe());
  }

 private:
  // null stays null: the legacy default stream
  static cudaStream_t stream_of(Stream s) { return static_cast<cudaStream_t>(s); }

  const int index_;
  std::mutex mu_;
  std::vector<cudaStream_t> streams_;
};

}  // namespace

DevicePtr cuda_device(int index) {
  const int count = cuda::device_count();
  if (count == 0) throw Error("no usable CUDA device: " + cuda::no_device_reason());
  if (index < 0 || index >= count)
    throw InvalidArgument("CUDA device " + std::to_string(index) + " does not exist: " + std::to_string(count) +
                          " visible (CUDA_VISIBLE_DEVICES, LOCAL_RANK)");
  static std::mutex mu;
  static std::vector<std::weak_ptr<Device>> devices;
  std::lock_guard<std::mutex> lock(mu);
  if (devices.size() < static_cast<size_t>(count)) devices.resize(count);
  DevicePtr d = devices[index].lock();
  if (!d) {
    d = std::make_shared<CudaDevice>(index);
    devices[index] = d;
  }
  return d;
}

#else

DevicePtr cuda_device(int index) {
  throw Error("CUDA device " + std::to_string(index) +
              ": bagua_core was built without CUDA (no CUDA toolkit at build time); rebuild it where nvcc is "
              "installed");
}

#endif

}  // namespace bagua
