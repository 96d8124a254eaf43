#include "comm/gloo/communicator.h"

#include <gloo/allgather.h>
#include <gloo/allreduce.h>
#include <gloo/alltoall.h>
#include <gloo/barrier.h>
#include <gloo/broadcast.h>
#include <gloo/common/error.h>
#include <gloo/common/logging.h>
#include <gloo/gather.h>
#include <gloo/reduce.h>
#include <gloo/scatter.h>
#include <gloo/transport/unbound_buffer.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include "comm/call_agreement.h"
#include "comm/call_checks.h"
#include "comm/gloo/algorithms.h"
#include "comm/gloo/failure_report.h"
#include "comm/gloo/lane_worker.h"
#include "comm/gloo/packed_allreduce.h"
#include "comm/gloo/setup.h"
#include "comm/gloo/wire_packing.h"
#include "comm/op_desc.h"
#include "comm/shm/shm_allreduce.h"
#include "common/error.h"
#include "kernels/reduce.h"
#include "kernels/scale.h"

namespace bagua {
namespace {

using std::chrono::milliseconds;
namespace ga = gloo_algorithms;

// Gloo's templated setters only use sizeof(T): pick an unsigned type of the
// element's size.
template <typename F>
void with_element_type(size_t elem_size, F&& f) {
  switch (elem_size) {
    case 1: return f(uint8_t{});
    case 2: return f(uint16_t{});
    case 4: return f(uint32_t{});
    case 8: return f(uint64_t{});
  }
  throw InvalidArgument("unsupported element size " + std::to_string(elem_size));
}

void copy_bytes(void* dst, const void* src, size_t n) {
  if (dst != src && n > 0) std::memmove(dst, src, n);
}

class GlooCommunicator : public Communicator {
 public:
  GlooCommunicator(StorePtr store, std::string prefix, int rank, int size, GlooCommunicatorOptions options)
      : store_(std::move(store)),
        prefix_(std::move(prefix)),
        rank_(rank),
        size_(size),
        options_(with_dead_ranks(std::move(options), store_)),
        packing_(options_),
        report_(store_, prefix_, rank_, size_, options_.timeout, options_.dead_ranks),
        send_seq_(size, 0),
        recv_seq_(size, 0) {
    if (size_ > 1) {
      lanes_ = connect_lanes(store_, prefix_, rank_, size_, options_, describe());
      for (size_t i = 1; i < lanes_.size(); ++i) workers_.push_back(std::make_unique<LaneWorker>());
      shm_ = join_shared_memory(store_, prefix_, rank_, size_, options_, describe());
      agree_on_wire_packing(*store_, prefix_, rank_, size_, options_.wire_packing, options_.timeout, describe());
    }
  }

  void close() override {
    std::lock_guard<std::mutex> g(mu_);
    closed_ = true;
    if (shm_) shm_->abort();  // a peer still waiting on us fails now
    shm_.reset();
    workers_.clear();  // joins the lane threads before their contexts go away
    lanes_.clear();    // ends the transport threads
  }

  ~GlooCommunicator() override {
    workers_.clear();  // joins the lane threads before their contexts go away
    lanes_.clear();
  }

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  DeviceType device_type() const override { return DeviceType::kCPU; }
  milliseconds timeout() const override { return options_.timeout; }
  std::string describe() const override {
    return "gloo group '" + prefix_ + "' rank " + std::to_string(rank_) + "/" + std::to_string(size_);
  }

  void allreduce(const void* send, void* recv, size_t count, DType dtype, ReduceOp op, Stream) override {
    OpDesc d{OpKind::kAllreduce, dtype, static_cast<int64_t>(count), -1, op};
    const CallChecks check(*this, d);
    check.dtype();
    check.buffer(send, count, "send");
    check.buffer(recv, count, "recv");
    const size_t es = dtype_size(dtype);
    ReduceFn fn = cpu_reduce_fn(dtype, op);
    run(d, -1, [&](uint32_t tag) {
      if (size_ == 1) {
        copy_bytes(recv, send, count * es);
      } else if (shm_ && shm_->covers(count * es) && shm_->map()) {
        shm_->allreduce(send, recv, count, dtype, op, fn);  // averages too
      } else if (packing_.takes_packed_path(dtype, op, count * es, [&](int64_t mine) {
                   std::vector<int64_t> all(size_);
                   allgather_words(&mine, 1, all.data(), tag | 0x40000000u);  // never a data or agreement tag
                   return all;
                 })) {
        packed_allreduce(send, recv, count, op == ReduceOp::kAvg, tag);
      } else {
        const auto started = std::chrono::steady_clock::now();
        const size_t parts = lanes_for(count * es);
        on_lanes(parts, [&](size_t lane) {
          const size_t b = count * lane / parts, e = count * (lane + 1) / parts;
          if (e == b) return;
          with_element_type(es, [&](auto t) {
            using T = decltype(t);
            gloo::AllreduceOptions o(lanes_[lane].context);
            T* in = static_cast<T*>(const_cast<void*>(send)) + b;
            T* out = static_cast<T*>(recv) + b;
            if (in != out) o.setInput(in, e - b);
            o.setOutput(out, e - b);
            o.setReduceFunction(fn);
            o.setTag(tag);
            o.setTimeout(options_.timeout);
            o.setMaxSegmentSize(options_.segment_bytes);
            gloo::allreduce(o);
          });
          if (op == ReduceOp::kAvg) cpu_average(static_cast<uint8_t*>(recv) + b * es, e - b, dtype, size_);
        });
        // A ring sends and receives 2 (size - 1) / size of the buffer per rank.
        if (packing_.packable(dtype, op, count * es))
          packing_.note_link_rate(2.0 * (size_ - 1) / size_ * count * es,
                                  std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count());
      }
    });
  }

  void reduce(const void* send, void* recv, size_t count, DType dtype, ReduceOp op, int root, Stream) override {
    OpDesc d{OpKind::kReduce, dtype, static_cast<int64_t>(count), root, op};
    const CallChecks check(*this, d);
    check.dtype();
    check.root();
    check.buffer(send, count, "send");
    if (rank_ == root) check.buffer(recv, count, "recv");
    const size_t es = dtype_size(dtype);
    ReduceFn fn = cpu_reduce_fn(dtype, op);
    run(d, -1, [&](uint32_t tag) {
      if (size_ == 1) {
        copy_bytes(recv, send, count * es);
      } else {
        // Gloo's ring writes partial results into every rank's output.
        void* out = recv;
        if (rank_ != root) out = scratch(count * es);
        with_element_type(es, [&](auto t) {
          using T = decltype(t);
          gloo::ReduceOptions o(main());
          T* in = static_cast<T*>(const_cast<void*>(send));
          if (static_cast<void*>(in) != out) o.setInput(in, count);
          o.setOutput(static_cast<T*>(out), count);
          o.setRoot(root);
          o.setReduceFunction(fn);
          o.setTag(tag);
          o.setTimeout(options_.timeout);
          o.setMaxSegmentSize(options_.segment_bytes);
          gloo::reduce(o);
        });
      }
      if (rank_ == root && op == ReduceOp::kAvg) cpu_average(recv, count, dtype, size_);
    });
  }

  void broadcast(void* buf, size_t count, DType dtype, int root, Stream) override {
    OpDesc d{OpKind::kBroadcast, dtype, static_cast<int64_t>(count), root};
    const CallChecks check(*this, d);
    check.dtype();
    check.root();
    check.buffer(buf, count, "buffer");
    run(d, -1, [&](uint32_t tag) {
      if (size_ == 1) return;
      with_element_type(dtype_size(dtype), [&](auto t) {
        using T = decltype(t);
        gloo::BroadcastOptions o(main());
        o.setOutput(static_cast<T*>(buf), count);
        o.setRoot(root);
        o.setTag(tag);
        o.setTimeout(options_.timeout);
        gloo::broadcast(o);
      });
    });
  }

  void allgather(const void* send, void* recv, size_t count, DType dtype, Stream) override {
    OpDesc d{OpKind::kAllgather, dtype, static_cast<int64_t>(count)};
    const CallChecks check(*this, d);
    check.dtype();
    check.buffer(send, count, "send");
    check.buffer(recv, count * size_, "recv");
    const size_t es = dtype_size(dtype);
    run(d, -1, [&](uint32_t tag) {
      if (size_ == 1) return copy_bytes(recv, send, count * es);
      const size_t block = count * es;
      const auto* s = static_cast<const uint8_t*>(send);
      const auto* r = static_cast<const uint8_t*>(recv);
      // In place when our block already sits at its slot of recv; any other overlap is copied first.
      if (s != r + rank_ * block && s < r + block * size_ && r < s + block)
        send = std::memcpy(scratch(block), send, block);
      ga::allgather_bytes(main(), send, recv, block, ga::make_slot(ga::kAllgatherSlotPrefix, tag), options_.timeout);
    });
  }

  void gather(const void* send, void* recv, size_t count, DType dtype, int root, Stream) override {
    OpDesc d{OpKind::kGather, dtype, static_cast<int64_t>(count), root};
    const CallChecks check(*this, d);
    check.dtype();
    check.root();
    check.buffer(send, count, "send");
    if (rank_ == root) check.buffer(recv, count * size_, "recv");
    const size_t es = dtype_size(dtype);
    run(d, -1, [&](uint32_t tag) {
      if (size_ == 1) return copy_bytes(recv, send, count * es);
      with_element_type(es, [&](auto t) {
        using T = decltype(t);
        gloo::GatherOptions o(main());
        o.setInput(static_cast<T*>(const_cast<void*>(send)), count);
        if (rank_ == root) o.setOutput(static_cast<T*>(recv), count * size_);
        o.setRoot(root);
        o.setTag(tag);
        o.setTimeout(options_.timeout);
        gloo::gather(o);
      });
    });
  }

  void scatter(const void* send, void* recv, size_t count, DType dtype, int root, Stream) override {
    OpDesc d{OpKind::kScatter, dtype, static_cast<int64_t>(count), root};
    const CallChecks check(*this, d);
    check.dtype();
    check.root();
    if (rank_ == root) check.buffer(send, count * size_, "send");
    check.buffer(recv, count, "recv");
    const size_t es = dtype_size(dtype);
    run(d, -1, [&](uint32_t tag) {
      if (size_ == 1) return copy_bytes(recv, send, count * es);
      with_element_type(es, [&](auto t) {
        using T = decltype(t);
        gloo::ScatterOptions o(main());
        if (rank_ == root) {
          std::vector<T*> chunks(size_);
          for (int i = 0; i < size_; ++i) chunks[i] = static_cast<T*>(const_cast<void*>(send)) + i * count;
          o.setInputs(chunks, count);
        }
        o.setOutput(static_cast<T*>(recv), count);
        o.setRoot(root);
        o.setTag(tag);
        o.setTimeout(options_.timeout);
        gloo::scatter(o);
      });
    });
  }

  void reduce_scatter(const void* send, void* recv, size_t count, DType dtype, ReduceOp op, Stream) override {
    OpDesc d{OpKind::kReduceScatter, dtype, static_cast<int64_t>(count), -1, op};
    const CallChecks check(*this, d);
    check.dtype();
    check.buffer(send, count * size_, "send");
    check.buffer(recv, count, "recv");
    const size_t es = dtype_size(dtype);
    ReduceFn fn = cpu_reduce_fn(dtype, op);
    run(d, -1, [&](uint32_t tag) {
      if (size_ == 1) {
        copy_bytes(recv, send, count * es);
      } else {
        ga::ring_reduce_scatter(main(), send, recv, count, es, fn, ga::make_slot(ga::kReduceScatterSlotPrefix, tag),
                                options_.timeout, options_.segment_bytes);
      }
      if (op == ReduceOp::kAvg) cpu_average(recv, count, dtype, size_);
    });
  }

  void alltoall(const void* send, void* recv, size_t count, DType dtype, Stream) override {
    OpDesc d{OpKind::kAlltoall, dtype, static_cast<int64_t>(count)};
    const CallChecks check(*this, d);
    check.dtype();
    check.buffer(send, count * size_, "send");
    check.buffer(recv, count * size_, "recv");
    const size_t es = dtype_size(dtype);
    run(d, -1, [&](uint32_t tag) {
      if (size_ == 1) return copy_bytes(recv, send, count * es);
      const size_t total = count * es * size_;
      const auto* s = static_cast<const uint8_t*>(send);
      const auto* r = static_cast<const uint8_t*>(recv);
      if (s < r + total && r < s + total) send = std::memcpy(scratch(total), send, total);  // overlapping
      ga::alltoall_bytes(main(), send, recv, count * es, ga::make_slot(ga::kAlltoallSlotPrefix, tag), options_.timeout);
    });
  }

  void alltoall_v(const void* send, const std::vector<size_t>& send_counts, const std::vector<size_t>& send_displs,
                  void* recv, const std::vector<size_t>& recv_counts, const std::vector<size_t>& recv_displs,
                  DType dtype, Stream) override {
    OpDesc d{OpKind::kAlltoallV, dtype, 0};
    const CallChecks check(*this, d);
    check.dtype();
    check.layout(send, send_counts, send_displs, "send");
    check.layout(recv, recv_counts, recv_displs, "recv");
    for (size_t c : send_counts) d.count += static_cast<int64_t>(c);
    if (send_counts[rank_] != recv_counts[rank_])
      check.invalid("send_counts[" + std::to_string(rank_) + "]=" + std::to_string(send_counts[rank_]) +
                    " differs from recv_counts[" + std::to_string(rank_) + "]=" + std::to_string(recv_counts[rank_]));
    const size_t es = dtype_size(dtype);
    std::vector<size_t> so(size_), sl(size_), ro(size_), rl(size_);
    for (int i = 0; i < size_; ++i) {
      so[i] = send_displs[i] * es;
      sl[i] = send_counts[i] * es;
      ro[i] = recv_displs[i] * es;
      rl[i] = recv_counts[i] * es;
    }
    const std::vector<int64_t> counts = encode_alltoallv_counts(send_counts, recv_counts);
    run(
        d, -1,
        [&](uint32_t tag) {
          if (size_ == 1) {
            return copy_bytes(static_cast<uint8_t*>(recv) + ro[0], static_cast<const uint8_t*>(send) + so[0], rl[0]);
          }
          ga::alltoallv_bytes(main(), send, so.data(), sl.data(), recv, ro.data(), rl.data(),
                              ga::make_slot(ga::kAlltoallvSlotPrefix, tag), options_.timeout);
        },
        &counts);
  }

  void send(const void* buf, size_t count, DType dtype, int peer, Stream) override {
    OpDesc d{OpKind::kSend, dtype, static_cast<int64_t>(count), peer};
    const CallChecks check(*this, d);
    check.dtype();
    check.peer();
    check.buffer(buf, count, "buffer");
    p2p(d, const_cast<void*>(buf), count * dtype_size(dtype), peer, true);
  }

  void recv(void* buf, size_t count, DType dtype, int peer, Stream) override {
    OpDesc d{OpKind::kRecv, dtype, static_cast<int64_t>(count), peer};
    const CallChecks check(*this, d);
    check.dtype();
    check.peer();
    check.buffer(buf, count, "buffer");
    p2p(d, buf, count * dtype_size(dtype), peer, false);
  }

  void barrier(Stream) override {
    OpDesc d{OpKind::kBarrier};
    run(d, -1, [&](uint32_t tag) {
      if (size_ == 1) return;
      gloo::BarrierOptions o(main());
      o.setTag(tag);
      o.setTimeout(options_.timeout);
      gloo::barrier(o);
    });
  }

 private:
  // The store's dead ranks, unless the caller gave its own way to learn them.
  static GlooCommunicatorOptions with_dead_ranks(GlooCommunicatorOptions options, const StorePtr& store) {
    if (!options.dead_ranks && store) {
      StorePtr s = store;
      options.dead_ranks = [s] { return s->dead_ranks(); };
    }
    return options;
  }

  const std::shared_ptr<gloo::Context>& main() { return lanes_[0].context; }

  // ---- packed allreduce (comm/gloo/packed_allreduce.h) ------------------------

  // Senders pack while their own measure says the link is slow (kOn: always).
  // Large buffers are split over the lanes like the ring's, each part its own
  // exchange on its own connections and threads.
  void packed_allreduce(const void* send, void* recv, size_t count, bool average, uint32_t tag) {
    const bool pack = packing_.senders_pack();
    const size_t parts = lanes_for(count * 4);
    if (packed_scratch_.size() < parts) packed_scratch_.resize(parts);
    std::vector<ga::PackedAllreduceStats> st(parts);
    on_lanes(parts, [&](size_t lane) {
      const size_t b = count * lane / parts, e = count * (lane + 1) / parts;
      st[lane] = ga::packed_allreduce_f32(
          lanes_[lane].context, static_cast<const float*>(send) + b, static_cast<float*>(recv) + b, e - b, average,
          pack, ga::make_slot(ga::kPackedAllreduceSlotPrefix, tag), options_.timeout,
          options_.wire_packing_segment_bytes / 4, options_.wire_packing_window_bytes / 4, packed_scratch_[lane]);
    });
    double bytes = 0, seconds = 0;
    for (const auto& s : st) {
      bytes += static_cast<double>(s.received_bytes);
      seconds = std::max(seconds, s.receiving_seconds);
    }
    packing_.note_link_rate(bytes, seconds);
  }

  size_t lanes_for(size_t bytes) const {
    if (bytes < options_.lane_threshold_bytes) return 1;
    return lanes_.size();
  }

  // Runs job(lane) for lanes 0..parts-1 at once: lane 0 on the calling
  // thread, the others on their workers. Rethrows the first failure after
  // every lane has finished (a dead peer fails every lane at once; otherwise
  // each lane's waits are bounded by the timeout).
  template <typename Job>
  void on_lanes(size_t parts, Job&& job) {
    if (parts == 1) return job(0);
    for (size_t i = 1; i < parts; ++i) workers_[i - 1]->submit([&job, i] { job(i); });
    std::exception_ptr first;
    try {
      job(0);
    } catch (...) {
      first = std::current_exception();
    }
    for (size_t i = 1; i < parts; ++i) {
      auto err = workers_[i - 1]->wait();
      if (err && !first) first = err;
    }
    if (first) std::rethrow_exception(first);
  }

  // Per-communicator scratch memory (the op lock is held while it is used).
  void* scratch(size_t bytes) {
    if (scratch_.size() < bytes) scratch_.resize(bytes);
    return scratch_.data();
  }

  // ---- running an operation, and failing well --------------------------------

  // Runs a collective: it takes the next number of the collective sequence,
  // and the ranks agree on the call before any data moves (see agree()).
  // Empty calls end after the agreement, so a rank with an empty array still
  // meets its peers. `counts` is alltoall_v's count matrix row.
  template <typename Body>
  void run(const OpDesc& d, int peer, Body&& body, const std::vector<int64_t>* counts = nullptr) {
    std::lock_guard<std::mutex> g(mu_);
    check_not_broken(d);
    const uint64_t seq = seq_++;
    if (size_ > 1) {
      if (!agreed_.empty()) {
        keep_promise(d, seq, peer);
      } else {
        agree(d, seq, peer, counts);
      }
    }
    if (d.has_dtype() && d.kind != OpKind::kAlltoallV && d.count == 0) return;
    guarded(d, seq, peer, [&] { body(static_cast<uint32_t>(seq)); });
  }

  // Gloo enforces matching sizes on its I/O thread, where a mismatch ends the
  // process (std::terminate). A small fixed-size allgather of the call first
  // turns any disagreement into a MismatchError on every rank; the
  // communicator stays usable since every rank skips the call.
  //
  // The agreement also carries what expect_calls() promised after this call:
  // when every rank promised the same calls, those skip their agreement.
  void agree(const OpDesc& d, uint64_t seq, int peer, const std::vector<int64_t>* counts) {
    // Its own tag range: never the tag of a collective's data.
    const uint32_t tag = static_cast<uint32_t>(seq) | 0x80000000u;
    std::vector<OpDesc> promised;
    promised.swap(promised_);
    const bool promising = !promised.empty() && same_desc(promised[0], d) && counts == nullptr;
    if (promising) promised.erase(promised.begin());
    std::vector<int64_t> all(kCallWords * size_);
    CallWire mine = encode_call(d, seq, promising ? announce(promised) : Announcement{});
    guarded(d, seq, peer, [&] { allgather_words(mine.data(), kCallWords, all.data(), tag); });
    std::string why = call_disagreement(all.data(), size_, rank_);
    if (why.empty() && promising && common_announcement(all.data(), size_) > 0)
      agreed_.assign(promised.begin(), promised.end());
    if (why.empty() && counts != nullptr) {
      std::vector<int64_t> matrix(counts->size() * size_);
      guarded(d, seq, peer, [&] { allgather_words(counts->data(), counts->size(), matrix.data(), tag); });
      why = alltoallv_disagreement(matrix.data(), size_);
    }
    if (!why.empty()) throw MismatchError(describe() + ": ranks disagree: " + why);
  }

  // A call every rank promised: the peers run it without an agreement, so
  // one that differs from the promise must not move any data.
  void keep_promise(const OpDesc& d, uint64_t seq, int peer) {
    const OpDesc expected = agreed_.front();
    agreed_.pop_front();
    if (same_desc(expected, d)) return;
    agreed_.clear();
    fail(d, seq, peer,
         "this rank called " + to_string(d) + " where it had promised " + to_string(expected) +
             " (expect_calls) to its peers, who run the promised call without agreeing on it",
         FailureKind::kOther);
  }

 public:
  void expect_calls(const std::vector<OpDesc>& calls) override {
    for (const OpDesc& c : calls)
      if (c.kind == OpKind::kAlltoallV || c.kind == OpKind::kSend || c.kind == OpKind::kRecv)
        throw InvalidArgument(describe() + ": expect_calls: " + to_string(c) + " cannot be promised");
    std::lock_guard<std::mutex> g(mu_);
    if (size_ == 1 || !agreed_.empty()) return;  // nothing to save, or still keeping a promise
    promised_ = calls;
  }

  // A control channel's agreement words (Communicator::agreement_allgather):
  // no agreement of its own, since the wire size never depends on the call.
  void agreement_allgather(const int64_t* words, size_t n, int64_t* all) override {
    const OpDesc d{OpKind::kAllgather, DType::kInt64, static_cast<int64_t>(n)};
    std::lock_guard<std::mutex> g(mu_);
    check_not_broken(d);
    const uint64_t seq = seq_++;
    if (!agreed_.empty()) keep_promise(d, seq, -1);
    if (size_ == 1) {
      std::copy(words, words + n, all);
      return;
    }
    const uint32_t tag = static_cast<uint32_t>(seq) | 0x80000000u;
    guarded(d, seq, -1, [&] { allgather_words(words, n, all, tag); });
  }

 private:
  void allgather_words(const int64_t* mine, size_t words, int64_t* all, uint32_t tag) {
    gloo::AllgatherOptions o(main());
    o.setInput(const_cast<int64_t*>(mine), words);
    o.setOutput(all, words * size_);
    o.setTag(tag);
    o.setTimeout(options_.timeout);
    gloo::allgather(o);
  }

  void check_not_broken(const OpDesc& d) const {
    if (closed_) throw Error(describe() + ": " + to_string(d) + ": the communicator was closed");
    if (!broken_.empty())
      throw Error(describe() + ": " + to_string(d) + ": communicator broken by an earlier failure: " + broken_);
  }

  // Turns Gloo's exceptions into ours and breaks the communicator.
  template <typename Body>
  void guarded(const OpDesc& d, uint64_t seq, int peer, Body&& body) {
    try {
      body();
    } catch (const InvalidArgument&) {
      throw;
    } catch (const ShmPeerLost& e) {
      fail(d, seq, e.peer(), e.what(), FailureKind::kLostPeer);
    } catch (const ShmTimeout& e) {
      fail(d, seq, peer, e.what(), FailureKind::kTimedOut);
    } catch (const gloo::IoException& e) {
      fail(d, seq, peer, e.what(), mentions_timeout(e.what()) ? FailureKind::kTimedOut : FailureKind::kLostPeer);
    } catch (const gloo::EnforceNotMet& e) {
      fail(d, seq, peer, e.what(), FailureKind::kOther);
    } catch (const std::exception& e) {
      fail(d, seq, peer, e.what(), mentions_timeout(e.what()) ? FailureKind::kTimedOut : FailureKind::kOther);
    }
  }

  // send/recv do not take a collective sequence number (other ranks do not
  // see them); they number messages per direction of each pair instead: the
  // n-th send from a to b meets the n-th recv on b from a.
  void p2p(const OpDesc& d, void* buf, size_t bytes, int peer, bool sending) {
    if (bytes == 0) return;
    std::lock_guard<std::mutex> g(mu_);
    check_not_broken(d);
    const uint64_t n = sending ? send_seq_[peer]++ : recv_seq_[peer]++;
    const int from = sending ? rank_ : peer;
    const int low = from < (sending ? peer : rank_) ? 0 : 1;
    guarded(d, n, peer, [&] {
      auto ub = main()->createUnboundBuffer(buf, bytes);
      const uint64_t slot = ga::make_slot(ga::kSendRecvSlotPrefix, static_cast<uint32_t>(n), low);
      if (sending) {
        ub->send(peer, slot);
        if (!ub->waitSend(options_.timeout)) throw gloo::IoException("send aborted");
      } else {
        ub->recv(peer, slot);
        if (!ub->waitRecv(options_.timeout)) throw gloo::IoException("receive aborted");
      }
    });
  }

  // Says what failed (comm/gloo/failure_report.h) and breaks the communicator.
  [[noreturn]] void fail(const OpDesc& d, uint64_t seq, int peer, const std::string& what, FailureKind kind) {
    std::string msg = report_.headline(describe(), d, seq, peer, kind);
    // Close first: peers blocked on us should not wait for the store query.
    break_connections(msg + " [gloo: " + what + "]", kind == FailureKind::kTimedOut);
    int dead = -1;
    msg += report_.explain(d, seq, kind, &dead);
    msg += " [gloo: " + what + "]";
    broken_ = msg;
    throw_failure(kind, msg, dead >= 0 ? dead : peer);
  }

  // After a failure the transport state is unknown: close every connection so
  // that peers blocked on us fail now instead of at their timeout.
  void break_connections(const std::string& why, bool timed_out) {
    broken_ = why;
    if (shm_) shm_->abort(timed_out);
    for (auto& lane : lanes_) {
      try {
        if (lane.context) lane.context->closeConnections();
      } catch (const std::exception&) {
      }
      lane.context.reset();
    }
  }

  StorePtr store_;
  const std::string prefix_;
  const int rank_;
  const int size_;
  GlooCommunicatorOptions options_;
  WirePackingPolicy packing_;
  FailureReport report_;

  std::vector<Lane> lanes_;
  std::vector<std::unique_ptr<LaneWorker>> workers_;
  std::unique_ptr<ShmAllreduce> shm_;  // null: the group is not on one host, or shm is off

  std::mutex mu_;  // one operation at a time
  uint64_t seq_ = 0;
  std::vector<OpDesc> promised_;  // expect_calls(), sent with the next agreement
  std::deque<OpDesc> agreed_;     // promised by every rank: they run without agreement
  std::vector<uint64_t> send_seq_;
  std::vector<uint64_t> recv_seq_;
  std::vector<uint8_t> scratch_;
  std::vector<ga::PackedAllreduceScratch> packed_scratch_;  // one per lane
  std::string broken_;
  bool closed_ = false;
};

}  // namespace

CommunicatorPtr create_gloo_communicator(StorePtr store, const std::string& prefix, int rank, int size,
                                         const GlooCommunicatorOptions& options) {
  if (size < 1) throw InvalidArgument("gloo communicator: size must be >= 1, got " + std::to_string(size));
  if (rank < 0 || rank >= size)
    throw InvalidArgument("gloo communicator: rank " + std::to_string(rank) + " is out of range [0, " +
                          std::to_string(size) + ")");
  if (options.timeout.count() <= 0) throw InvalidArgument("gloo communicator: timeout must be positive");
  if (!store && size > 1) throw InvalidArgument("gloo communicator: store is null");
  return std::make_shared<GlooCommunicator>(std::move(store), prefix, rank, size, options);
}

CommunicatorPtr create_gloo_communicator(StorePtr store, const std::string& prefix, int rank, int size,
                                         std::chrono::milliseconds timeout, const std::string& hostname,
                                         DeadRanksFn dead_ranks) {
  GlooCommunicatorOptions options;
  options.timeout = timeout;
  options.hostname = hostname;
  options.dead_ranks = std::move(dead_ranks);
  return create_gloo_communicator(std::move(store), prefix, rank, size, options);
}

}  // namespace bagua
