// The one interface every communicator implements (Gloo on CPU, NCCL on CUDA).
//
// Buffers are raw pointers plus an element count and a dtype; the bindings turn
// DLPack arrays into these. `count` is always in elements. Where an operation
// takes one chunk per rank (allgather, gather, scatter, reduce_scatter,
// alltoall) `count` is the size of one chunk. Empty buffers (count == 0) are a
// no-op. `stream` is a cudaStream_t for CUDA communicators and ignored on CPU.
// Every call blocks until the operation is complete (CPU) or enqueued (CUDA),
// and throws bagua::Error subclasses on failure, bagua::InvalidArgument on bad
// input.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "comm/op_desc.h"
#include "common/dtype.h"

namespace bagua {

class Communicator {
 public:
  virtual ~Communicator() = default;

  virtual int rank() const = 0;
  virtual int size() const = 0;
  virtual DeviceType device_type() const = 0;
  // Human-readable identity for error messages, e.g. "gloo group 'world' rank 1/3".
  virtual std::string describe() const = 0;

  virtual void allreduce(const void* send, void* recv, size_t count, DType dtype, ReduceOp op,
                         Stream stream = nullptr) = 0;
  // recv is only written on root (may be null elsewhere).
  virtual void reduce(const void* send, void* recv, size_t count, DType dtype, ReduceOp op, int root,
                      Stream stream = nullptr) = 0;
  virtual void broadcast(void* buf, size_t count, DType dtype, int root, Stream stream = nullptr) = 0;
  // recv holds size() * count elements; send may alias recv + rank() * count.
  virtual void allgather(const void* send, void* recv, size_t count, DType dtype, Stream stream = nullptr) = 0;
  // recv (size() * count elements) is only written on root.
  virtual void gather(const void* send, void* recv, size_t count, DType dtype, int root, Stream stream = nullptr) = 0;
  // send (size() * count elements) is only read on root.
  virtual void scatter(const void* send, void* recv, size_t count, DType dtype, int root, Stream stream = nullptr) = 0;
  // send holds size() * count elements; rank r receives the reduction of chunk r.
  virtual void reduce_scatter(const void* send, void* recv, size_t count, DType dtype, ReduceOp op,
                              Stream stream = nullptr) = 0;
  // send and recv hold size() * count elements; chunk j of send goes to rank j.
  virtual void alltoall(const void* send, void* recv, size_t count, DType dtype, Stream stream = nullptr) = 0;
  // counts and displacements in elements, one entry per rank.
  virtual void alltoall_v(const void* send, const std::vector<size_t>& send_counts,
                          const std::vector<size_t>& send_displs, void* recv, const std::vector<size_t>& recv_counts,
                          const std::vector<size_t>& recv_displs, DType dtype, Stream stream = nullptr) = 0;
  virtual void send(const void* buf, size_t count, DType dtype, int peer, Stream stream = nullptr) = 0;
  virtual void recv(void* buf, size_t count, DType dtype, int peer, Stream stream = nullptr) = 0;
  virtual void barrier(Stream stream = nullptr) = 0;

  // Timeout of every blocking call on this communicator.
  virtual std::chrono::milliseconds timeout() const = 0;

  // CUDA device index of a device communicator (NCCL); -1 on host communicators.
  virtual int device_index() const { return -1; }

  // The agreement traffic of another communicator this one is the control
  // channel of (comm/agreed_communicator.h): every rank passes `n` int64
  // words of host memory (the same `n` on every rank, a fixed-size wire form)
  // and receives everyone's, in rank order, in `all` (size() * n words). It
  // takes a place in this communicator's collective order like any call.
  // Default: allgather. Gloo skips its own call agreement for it (the words
  // are an agreement already), so agreeing on a device call costs one small
  // host allgather.
  virtual void agreement_allgather(const int64_t* words, size_t n, int64_t* all) {
    allgather(words, all, n, DType::kInt64);
  }

  // Releases connections and threads now, after the operation in progress;
  // every later call raises bagua::Error. Idempotent. Called when the process
  // group (or the engine) owning the communicator is closed, so that threads
  // end even while other objects (ops, views) still hold a reference.
  virtual void close() {}

  // A promise of the caller's thread: its next collectives on this
  // communicator are exactly `calls`, in this order (send/recv aside). A
  // communicator that agrees with its peers before every collective (Gloo)
  // sends the promise with the first call's agreement; when every rank
  // promised the same calls, the others run without one (one exchange
  // instead of calls.size()). Ranks that promise differently, or nothing,
  // just agree call by call. Breaking the promise is a bug of the caller: the
  // call raises bagua::Error and the communicator breaks. Default: ignored.
  virtual void expect_calls(const std::vector<OpDesc>& calls) { (void)calls; }
};

using CommunicatorPtr = std::shared_ptr<Communicator>;

}  // namespace bagua
