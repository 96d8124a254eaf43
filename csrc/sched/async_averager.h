// The background loop of asynchronous model average: weights averaged with
// every rank while training runs (ops/async_model_average.h holds the
// arithmetic and the rounds' collectives).
//
// It owns one thread and runs on communicators nobody else uses (the
// frontends give it a clone of the training group), so it never interleaves
// with the training thread's collectives. The weights are buckets the
// frontend trains with (torch: the parameters are views of them; JAX: the
// transform's copy of the weights), in host memory or all on one Device.
//
// On a Device the loop has a stream of its own: the snapshot and the apply
// are enqueued there, after an event the training thread records on its
// stream when it releases the weight lock (its last optimizer step), and the
// loop waits for its stream before it releases the lock, so the training
// stream never sees half an average. The step's communicator then serves
// device memory (NCCL, or a host one staged: comm/staged_communicator.h);
// the ranks' stop flags travel on `control`, a host communicator.
//
// The weight lock keeps an optimizer step whole: the training thread holds it
// (lock_weights / unlock_weights) around every change of the weights; the loop
// takes it only to snapshot the weights and to apply an average, never during
// communication. Two parties only: while the loop waits for the lock the
// training thread cannot take it again first, so averages are never starved.
//
// start() begins rounds, each after a pause of sync_interval_ms; abort() asks the ranks to
// stop and blocks until every rank asked, the last round ran with the
// training stopped everywhere (so every rank then holds the same weights) and
// the thread ended; start() again resumes. A failure of the loop (a dead or
// stuck peer) ends it and is raised, with its type, by every later
// lock_weights(), start(), abort() and check() on this rank.
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <exception>
#include <memory>
#include <mutex>
#include <optional>
#include <thread>
#include <vector>

#include "bucket/bucket.h"
#include "ops/async_model_average.h"

namespace bagua {

class AsyncAverager {
 public:
  // `timeout` bounds abort()'s wait for the other ranks to abort too.
  // `control`: a host communicator over the same ranks, used by nobody else
  // (default: the step's own, which must then be a host one).
  AsyncAverager(std::shared_ptr<const AsyncModelAverageStep> step, std::vector<BucketPtr> weights,
                std::chrono::milliseconds timeout, CommunicatorPtr control = nullptr);
  ~AsyncAverager();  // close()
  AsyncAverager(const AsyncAverager&) = delete;
  AsyncAverager& operator=(const AsyncAverager&) = delete;

  // Starts the loop (no-op while it runs). Raises the loop's failure, if any.
  void start();
  // See above. No-op when the loop is not running. Raises the loop's failure,
  // or TimeoutError when the other ranks did not abort within the timeout: the
  // request is then withdrawn (the loop keeps running as if abort() had not
  // been called, so a rank that goes back to training is never stopped by the
  // others' later abort()); call abort() again on every rank. A round that
  // read the request before the withdrawal is collective: its decision
  // stands, so abort() waits for it and returns normally when that round
  // found every rank stopping (the peers' loops end with it).
  void abort();
  // The weight lock, for the training thread. lock_weights() raises the
  // loop's failure instead of blocking once the loop failed.
  void lock_weights();
  // `producer`: on a Device, the training stream that changed the weights.
  void unlock_weights(std::optional<Stream> producer = std::nullopt);
  // Raises the loop's failure, if any.
  void check() const;

  bool running() const;
  uint64_t rounds() const;  // averaging rounds completed since construction
  std::chrono::milliseconds timeout() const { return timeout_; }
  std::string describe() const { return step_->describe(); }

  // Ends the loop without asking the peers (shutdown) and joins it. Idempotent.
  void close();

  // For tests only: a deterministic window between a round's snapshot and
  // its apply. While test_hold(true), every round stops right after taking
  // its snapshot (the weight lock released, before its allreduce);
  // test_wait_held() returns true once one has (false after `timeout`), and
  // test_release_held() lets that one round go on. test_hold(false) lets any
  // held round go on and stops holding.
  void test_hold(bool on);
  bool test_wait_held(std::chrono::milliseconds timeout);
  void test_release_held();

 private:
  class LoopLock;
  void loop();
  void round();
  void join_finished();
  void raise_locked() const;

  std::shared_ptr<const AsyncModelAverageStep> step_;
  std::vector<BucketPtr> weights_;
  std::vector<std::shared_ptr<void>> snapshots_, averages_;
  CommunicatorPtr control_;
  DevicePtr device_;              // null: host memory
  Stream stream_ = nullptr;       // the loop's, on device_
  DeviceEventPtr training_done_;  // recorded by unlock_weights(producer)
  bool training_recorded_ = false;
  GrowOnlyScratch scratch_;
  const std::chrono::milliseconds timeout_;

  mutable std::mutex mu_;
  std::condition_variable cv_;  // every change of the fields below
  bool held_ = false;           // the weight lock
  bool loop_waiting_ = false;   // the loop waits for the weight lock
  bool running_ = false;
  bool stop_requested_ = false;
  bool deciding_ = false;   // a round's all_stopped() is in flight
  bool finishing_ = false;  // a round found every rank stopping: the loop ends after it
  bool closing_ = false;
  uint64_t rounds_ = 0;
  bool test_hold_ = false;     // test_hold(true)
  bool test_held_ = false;     // a round waits after its snapshot
  bool test_release_ = false;  // test_release_held(): that round goes on
  std::exception_ptr error_;
  std::thread thread_;
};

}  // namespace bagua
