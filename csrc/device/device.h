// The engine's one door to a device: memory, streams, asynchronous copies and
// memsets, events. Everything the device path of the engine does to memory or
// ordering goes through a Device, so the same bucket, step and engine code
// runs on a GPU and, in the test suite, on the host implementation.
//
// Two implementations:
//   * cuda_device(index): CUDA memory, cudaStream_t streams, cudaEvent_t
//     events (builds with CUDA only; elsewhere the factory throws).
//   * host_device(delay): host memory, and each stream an ordered queue run
//     by its own thread. Work enqueued on a stream runs in order,
//     asynchronously to the caller; events are real waits. `delay` is added
//     before every queued task, so that a missing wait (reading a buffer
//     before the work that writes it ran, reusing one while in flight) shows
//     up as a wrong value, not as a lucky race.
//
// Contract common to both:
//   * allocate() is for bind time (buckets, results, state, scratch): never
//     call it per step (on CUDA it serialises against in-flight NCCL work).
//     Memory is zeroed and lives as long as the returned pointer (and the
//     Device, which every allocation keeps alive).
//   * copy_async / memset_async / enqueue_host return at once; the work runs
//     in stream order. copy_async copies in any direction (device, host,
//     pinned host).
//   * An event records the point of a stream at record(); wait(stream, e)
//     makes later work on `stream` wait for it without blocking the caller;
//     synchronize(e) / synchronize(stream) block the caller.
//   * Failures of queued work surface, as bagua::Error, from the next
//     synchronize of that stream (or of an event recorded after it), as CUDA
//     reports asynchronous errors; the stream then stays failed.
// A Stream is the native handle (cudaStream_t, or the host queue) and is
// owned by the Device that made it: valid as long as the Device.
#pragma once

#include <chrono>
#include <cstddef>
#include <functional>
#include <memory>
#include <string>

#include "common/dtype.h"

namespace bagua {

class DeviceEvent {
 public:
  virtual ~DeviceEvent() = default;
};
using DeviceEventPtr = std::shared_ptr<DeviceEvent>;

class Device : public std::enable_shared_from_this<Device> {
 public:
  virtual ~Device() = default;

  // Memory kind of allocate(): kCUDA, or kCPU for the host implementation.
  virtual DeviceType type() const = 0;
  virtual int index() const = 0;
  // "cuda:0", "host (ordered queues, 2000 us per task)"
  virtual std::string describe() const = 0;
  // Whether the host may touch allocate()'s memory directly (after a synchronize).
  bool host_accessible() const { return type() == DeviceType::kCPU; }

  // Zeroed device memory (bind time only; see above).
  virtual std::shared_ptr<void> allocate(size_t nbytes) = 0;
  // Zeroed page-locked host memory for staging copies (bind time only).
  virtual std::shared_ptr<void> allocate_pinned(size_t nbytes) = 0;

  // A new stream, owned by this device.
  virtual Stream new_stream() = 0;
  virtual void copy_async(void* dst, const void* src, size_t nbytes, Stream stream) = 0;
  virtual void memset_async(void* dst, int value, size_t nbytes, Stream stream) = 0;
  // Runs `fn` on the host in stream order (host implementation: on the
  // queue's thread; CUDA: a host function of the stream, which must not call
  // CUDA). Element math of the host implementation runs this way.
  virtual void enqueue_host(Stream stream, std::function<void()> fn) = 0;

  virtual DeviceEventPtr new_event() = 0;
  virtual void record(const DeviceEventPtr& event, Stream stream) = 0;
  virtual void wait(Stream stream, const DeviceEventPtr& event) = 0;
  // Blocks until the event's work is done; throws TimeoutError after `timeout`
  // (a stuck stream, e.g. a peer that never sends) and Error on failed work.
  virtual void synchronize(const DeviceEventPtr& event, std::chrono::milliseconds timeout) = 0;
  virtual void synchronize(Stream stream, std::chrono::milliseconds timeout) = 0;
};

using DevicePtr = std::shared_ptr<Device>;

// The CUDA device `index` (one instance per index and process). Throws
// InvalidArgument for an index beyond the visible devices, and Error naming
// the reason when there is no usable GPU or the build has no CUDA.
DevicePtr cuda_device(int index);

// A new host implementation; `delay` is added before each queued task.
DevicePtr host_device(std::chrono::microseconds delay = std::chrono::microseconds(0));
// A stream of a host implementation with a delay of its own (tests make one
// side of an ordering slow); InvalidArgument for other devices.
Stream new_host_stream(Device& host, std::chrono::microseconds delay);

}  // namespace bagua
