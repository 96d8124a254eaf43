// The overlap engine of one process group: ordered buckets, readiness, and
// comm threads that run each bucket's op chain.
//
// Launch rule: a bucket launches when all its slots are marked ready AND every
// earlier bucket (registration order) has launched. Every rank therefore
// issues the same collectives in the same order, without negotiation.
//
// Lanes: the engine has one or more lanes, each a set of communicators only it
// uses and one comm thread. Bucket i runs on lane i % lanes, and each lane
// runs its buckets in launch order, so every communicator still sees the same
// collectives in the same order on every rank. With two lanes consecutive
// buckets pipeline: one compresses, packs or reduces on the CPU while the
// other's bytes are on the wire.
// Ops are made for their bucket's lane (comms_for).
//
// Device buckets (Bucket::device(), device/device.h): every bucket of an
// engine is on the same Device, and each lane has a comm stream on it. A
// bucket's op chain is enqueued on its lane's stream after that stream waits
// for the bucket's ready event, recorded on the producer stream passed to the
// mark_ready call that launched it (the framework's stream: the gradients of
// a step are produced in that stream's order, so one event per bucket covers
// all its tensors). wait(consumer) makes the consumer stream (the one the
// optimizer runs on) wait for every bucket's done event, or, without a
// consumer, blocks the caller until the device finished them. On a device,
// timings' end_ns is when the chain was enqueued, not when the device ran it.
//
// A step begins with the first mark_ready after wait() (or construction) and
// ends with wait(), which blocks until every bucket has launched and finished,
// then resets readiness. wait() raises, in the caller:
//   * the first error of a comm thread, with the same type (TimeoutError,
//     PeerError, ...), its message prefixed by the bucket, its tensors and the op;
//   * TimeoutError naming the tensors never marked ready, when some bucket has
//     not launched `timeout` after wait() began;
//   * TimeoutError when a launched bucket runs longer than 1.5 x timeout
//     (a watchdog; communicators normally fail sooner with their own timeout).
// wait() raises only once no lane runs a bucket any more (the others' running
// buckets end on their own, or meet the watchdog), so no comm thread touches
// the buckets afterwards. After any such error the engine is broken:
// mark_ready is ignored, the lanes skip their queued buckets and every later
// wait() raises, since ranks can no longer agree on what was sent.
//
// wait_any(buckets) waits for some of the step's buckets only: it returns the
// lowest of `buckets` that has finished, so a frontend can use each bucket's
// results (e.g. apply the optimizer to its parameters) while later buckets
// still communicate. Same deadlines, failures and device handling as wait()
// (the unready deadline applies while the lowest of `buckets` has not
// launched); it does not end the step: wait() does, at once when every bucket
// has finished.
//
// Thread safety: mark_ready may be called from any thread; registration
// (add_bucket, append_op, ...) only between steps. Nothing here touches the
// GIL; the bindings release it around blocking calls.
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <exception>
#include <functional>
#include <optional>
#include <mutex>
#include <string>
#include <thread>
#include <unordered_map>
#include <vector>

#include "bucket/bucket.h"
#include "ops/comm_set.h"
#include "sched/op.h"

namespace bagua {

// Per-bucket times of the current (or last) step, in nanoseconds of the
// monotonic clock (std::chrono::steady_clock = CLOCK_MONOTONIC on Linux, the
// clock of Python's time.monotonic_ns()). -1 when it has not happened.
// ready_ns is recorded only while set_record_ready(true) (a trace or the
// autotuner asked for it): off, readiness costs no clock reads.
struct BucketTiming {
  int64_t ready_ns = -1;   // its last tensor was marked ready
  int64_t launch_ns = -1;  // all slots ready and earlier buckets launched
  int64_t start_ns = -1;   // its lane's comm thread began its op chain
  int64_t end_ns = -1;     // the op chain finished (or failed)
};

int64_t monotonic_ns();

class Engine {
 public:
  // One lane per CommSet (at least one); timeout: see wait(). Starts the comm threads.
  Engine(std::vector<CommSet> lanes, std::chrono::milliseconds timeout);
  ~Engine();  // close()
  Engine(const Engine&) = delete;
  Engine& operator=(const Engine&) = delete;

  const CommSet& comms() const { return lanes_.front().comms; }  // lane 0's
  size_t num_lanes() const { return lanes_.size(); }
  // The communicators the ops of bucket `index` must be made with.
  const CommSet& comms_for(size_t index) const { return lanes_[index % lanes_.size()].comms; }
  std::chrono::milliseconds timeout() const { return timeout_; }

  // ---- registration (between steps) ----
  // Appends a bucket; returns its index. Slot names must be unique across buckets.
  size_t add_bucket(BucketPtr bucket);
  // Removes every bucket (after the current step, if any, was waited for).
  void clear_buckets();
  size_t num_buckets() const;
  BucketPtr bucket(size_t index) const;
  // Binds `op` to the bucket and appends it to its chain.
  void append_op(size_t bucket, OpPtr op);
  void clear_ops(size_t bucket);
  std::vector<OpPtr> ops(size_t bucket) const;

  // ---- readiness (any thread) ----
  // `producer`: the stream that wrote the tensors (device buckets only; none:
  // their memory is already final, e.g. written by the host).
  void mark_ready(size_t bucket, size_t slot, std::optional<Stream> producer = std::nullopt);
  void mark_ready(const std::string& slot_name, std::optional<Stream> producer = std::nullopt);
  void mark_bucket_ready(size_t bucket, std::optional<Stream> producer = std::nullopt);
  void mark_all_ready(std::optional<Stream> producer = std::nullopt);

  // Ends the step (see above). Returns at once when no step is in progress.
  // `consumer`: see "Device buckets" above; ignored for host buckets.
  void wait(std::optional<Stream> consumer = std::nullopt);
  // The lowest of `buckets` (indices, not empty) that has finished in the
  // current step, waiting for one if none has (see above); the lowest of
  // them at once when no step is in progress. `consumer`: as for wait(), for
  // that bucket's device work.
  size_t wait_any(const std::vector<size_t>& buckets, std::optional<Stream> consumer = std::nullopt);

  // The Device of the buckets (null for host buckets) and lane l's comm stream.
  const DevicePtr& device() const { return device_; }
  Stream lane_stream(size_t lane) const { return lanes_.at(lane).stream; }

  // ---- observation ----
  std::vector<BucketTiming> timings() const;  // current or last step
  // Records when each tensor (and bucket) became ready, from the next step on
  // (between steps). Off by default: then ready times stay -1.
  void set_record_ready(bool on);
  bool record_ready() const;
  // Per slot of `bucket`, when it was marked ready in the current or last
  // step (-1: not marked, padding, or recording off).
  std::vector<int64_t> slot_ready_ns(size_t bucket) const;
  uint64_t launches() const;  // buckets launched since construction
  uint64_t steps() const;     // steps completed by wait()
  bool in_step() const;
  bool broken() const;

  // Stops the comm threads after the buckets they run, if any (queued buckets
  // are dropped) and joins them. Idempotent; later calls raise Error.
  void close();

 private:
  struct Entry {
    BucketPtr bucket;
    std::vector<OpPtr> ops;
    std::vector<uint8_t> ready;
    size_t ready_count = 0;
    size_t padding_count = 0;
    BucketTiming timing;
    bool finished = false;               // this step (ran, failed or skipped)
    std::vector<int64_t> slot_ready_ns;  // filled while record_ready_
    DeviceEventPtr ready_event;          // device buckets: see above
    DeviceEventPtr done_event;
    bool ready_recorded = false;  // this step
  };
  struct Lane {
    CommSet comms;
    std::deque<size_t> queue;  // launched buckets of this lane, in order
    std::thread thread;
    Stream stream = nullptr;  // device buckets: the lane's comm stream
  };

  void check_usable_locked() const;
  void check_idle_locked(const char* what) const;
  void begin_step_locked();
  void mark_locked(size_t bucket, size_t slot);
  void launch_ready_locked(const std::optional<Stream>& producer);
  void use_device_locked(const DevicePtr& device);
  void reset_step_locked();
  // Blocks until done() holds, or raises as wait() does; the unready deadline
  // applies while fewer than `must_launch` buckets have launched.
  void await_locked(std::unique_lock<std::mutex>& lk, const std::function<bool()>& done, size_t must_launch);
  [[noreturn]] void raise_failure_locked();
  void finish_on_device_locked(std::unique_lock<std::mutex>& lk, const std::optional<Stream>& consumer,
                               const std::vector<DeviceEventPtr>& done);
  void fail_locked(std::exception_ptr error);
  std::string unready_report_locked() const;
  std::string position(size_t index) const;  // "#i of n"
  size_t first_unfinished_locked() const;    // lowest launched bucket still running; next_launch_ if none
  void comm_loop(size_t lane);
  std::vector<OpDesc> predict_step_locked(size_t lane) const;

  std::vector<Lane> lanes_;
  const std::chrono::milliseconds timeout_;
  DevicePtr device_;

  mutable std::mutex mu_;
  std::condition_variable work_cv_;  // comm threads: queue or stop
  std::condition_variable done_cv_;  // wait(): progress or failure
  std::vector<Entry> entries_;
  std::unordered_map<std::string, std::pair<size_t, size_t>> by_name_;
  bool in_step_ = false;
  bool record_ready_ = false;
  size_t next_launch_ = 0;  // buckets [0, next_launch_) launched this step
  size_t finished_ = 0;     // how many of them finished
  uint64_t launches_ = 0;
  uint64_t steps_ = 0;
  std::exception_ptr error_;  // first failure, raised once by wait()
  bool error_raised_ = false;
  std::string broken_;  // non-empty once broken
  bool stop_ = false;
  bool closed_ = false;
};

}  // namespace bagua
