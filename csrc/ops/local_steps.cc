#include "ops/local_steps.h"

#include <chrono>
#include <cstdio>
#include <cstring>
#include <deque>
#include <future>
#include <map>
#include <memory>
#include <mutex>

#include "bucket/host_memory.h"
#include "ops/compressed_exchange.h"
#include "ops/elementwise.h"
#include "ops/exchange_worker.h"
#include "ops/hierarchical.h"
#include "ops/kernels.h"

namespace bagua {
namespace {

std::string number_text(double v) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.17g", v);
  return buf;
}

// In-flight exchanges of streaming steps (overlap_steps > 0), process-wide: a Step keeps no
// state between runs and the JAX adapter's buffers move between calls, so an exchange that
// outlives its run owns its memory here. Keyed by bucket and fragment; a bucket is named by its
// step's description, communicator, size and dtype, and its position among the step's runs with
// that name in one training step (buckets run in the same order every step, on every rank).
struct Flight {
  int64_t started = 0;  // the step number that launched it
  std::shared_future<void> done;
  std::shared_ptr<void> d;                 // the pseudo-gradient, then its average
  std::shared_ptr<void> error;             // the residual after the exchange (error feedback)
  size_t mine_bad = 0;                     // this rank's non-finite values in its pseudo-gradient
  std::shared_ptr<ExchangeWorker> worker;  // kept running while the exchange is in flight
};

struct Flights {
  std::mutex mu;
  std::map<std::string, std::deque<Flight>> by_key;
  std::map<std::string, std::pair<int64_t, int>> position;  // bucket name -> (last step, runs at it)
};

Flights& flights() {
  static Flights f;
  return f;
}

}  // namespace

void average_over(const CommSet& comms, const std::optional<Codec>& codec, bool hierarchical, const ExecContext& ctx,
                  Span data, const Span* error) {
  run_centralized(comms, ctx, hierarchical, data, ReduceOp::kAvg, [&](Communicator& c) {
    if (codec && codec->sparse())
      compressed_allgather_reduce(c, ctx, data, true, error, *codec);
    else if (codec)
      compressed_scatter_reduce_gather(c, ctx, data, true, error, &*codec);
    else
      c.allreduce(data.data, data.data, data.count, data.dtype, ReduceOp::kAvg, ctx.stream);
  });
}

std::string LocalStepsStep::flight_bucket(const Span& data, int64_t step) const {
  char ptr[32];
  std::snprintf(ptr, sizeof ptr, "%p", static_cast<const void*>(comms_.global.get()));
  const std::string name = describe() + "|" + ptr + "|" + std::to_string(data.count) + "|" + dtype_name(data.dtype);
  Flights& f = flights();
  std::lock_guard<std::mutex> lk(f.mu);
  auto& pos = f.position[name];
  if (pos.first != step) pos = {step, 0};
  return name + "#" + std::to_string(pos.second++);
}

void LocalStepsStep::launch(const Span& weights, const Span& anchor, const Span& residual, bool fresh,
                            const std::string& key, int64_t step) const {
  const size_t nbytes = weights.nbytes();
  Flight flight;
  flight.started = step;
  flight.d = allocate_host_memory(nbytes);
  std::memcpy(flight.d.get(), weights.data, nbytes);
  const ExecContext host;
  step_kernels::pseudo_gradient(host, flight.d.get(), anchor.data, weights.count, weights.dtype);
  flight.mine_bad = step_kernels::count_nonfinite(host, flight.d.get(), weights.count, weights.dtype, kCountSlot);
  if (error_feedback_) {
    flight.error = allocate_host_memory(nbytes);  // zeroed: the first exchange starts from no residual
    if (!fresh) std::memcpy(flight.error.get(), residual.data, nbytes);
  }
  flight.worker = ExchangeWorker::of(comms_.global);
  auto scratch = std::make_shared<GrowOnlyScratch>();
  Span d{flight.d.get(), weights.count, weights.dtype};
  Span e{flight.error.get(), weights.count, weights.dtype};
  // the closure must not own the worker: it is destroyed on the worker's own thread
  flight.done =
      flight.worker->submit([comms = comms_, codec = codec_, d, e, keep_d = flight.d, keep_e = flight.error, scratch] {
        ExecContext ctx;
        ctx.scratch = scratch.get();
        average_over(comms, codec, false, ctx, d, e.data ? &e : nullptr);
      });
  Flights& f = flights();
  std::lock_guard<std::mutex> lk(f.mu);
  auto& queue = f.by_key[key];
  while (!queue.empty() && queue.back().started >= step) queue.pop_back();  // a previous run's, counter restarted
  queue.push_back(std::move(flight));
}

void LocalStepsStep::land(const ExecContext& ctx, const Span& weights, const Span& anchor, const Span& momentum,
                          const Span& residual, bool fresh, const std::string& key, int64_t started) const {
  Flight flight;
  {
    Flights& f = flights();
    std::lock_guard<std::mutex> lk(f.mu);
    auto& queue = f.by_key[key];
    while (!queue.empty() && queue.front().started < started) queue.pop_front();  // abandoned
    if (queue.empty() || queue.front().started != started) return;  // none in flight: restored from a checkpoint
    flight = std::move(queue.front());
    queue.pop_front();
  }
  const auto limit = comms_.global->timeout() * 3;
  if (flight.done.wait_for(limit) != std::future_status::ready)
    throw Error(describe() + ": the exchange started at step " + std::to_string(started) + " is still running after " +
                std::to_string(std::chrono::duration_cast<std::chrono::seconds>(limit).count()) + " s");
  flight.done.get();  // rethrows the exchange's failure
  Span avg{flight.d.get(), weights.count, weights.dtype};
  refuse_nonfinite(ctx, avg, anchor, flight.mine_bad, &weights);
  if (error_feedback_) std::memcpy(residual.data, flight.error.get(), weights.nbytes());
  if (mixing_ == 0.0) {
    step_kernels::outer_sgd(ctx, weights.data, anchor.data, momentum.data, avg.data, avg.count, avg.dtype, lr_,
                            momentum_, nesterov_, fresh);
    return;
  }
  step_kernels::outer_sgd(ctx, avg.data, anchor.data, momentum.data, avg.data, avg.count, avg.dtype, lr_, momentum_,
                          nesterov_, fresh);
  step_kernels::outer_mix(ctx, weights.data, avg.data, weights.count, weights.dtype, mixing_);
}

LocalStepsStep::LocalStepsStep(CommSet comms, const StepParams& params) : comms_(std::move(comms)) {
  const std::string name = "local_steps";
  params.check_known(
      name, {"sync_interval", "warmup_steps", "outer_lr", "outer_momentum", "nesterov", "hierarchical", "compression",
             "error_feedback", "topk_density", "num_fragments", "overlap_steps", "mixing"});
  interval_ = params.get_int(name, "sync_interval", 8);
  warmup_ = params.get_int(name, "warmup_steps", 0);
  lr_ = params.get_double(name, "outer_lr", 0.7);
  momentum_ = params.get_double(name, "outer_momentum", 0.9);
  nesterov_ = params.get_bool(name, "nesterov", true);
  hierarchical_ = params.get_bool(name, "hierarchical", false);
  const std::string compression = params.get_string(name, "compression", "none");
  error_feedback_ = params.get_bool(name, "error_feedback", false);
  const bool has_density = params.has("topk_density");
  const double density = params.get_double(name, "topk_density", 0.02);
  if (compression != "none") codec_ = Codec::make(name, compression, density);
  if (has_density && !(codec_ && codec_->sparse()))
    throw InvalidArgument(name + ": topk_density is for the top-k compressions (topk_uint4, topk_uint2), not '" +
                          compression + "'");
  compressed_ = codec_.has_value();
  if (error_feedback_ && !compressed_)
    throw InvalidArgument(name + ": error_feedback needs a compression (there is no residual without it)");
  if (!comms_.global) throw InvalidArgument(name + ": no communicator");
  if (interval_ < 1) throw InvalidArgument(name + ": sync_interval must be >= 1, got " + std::to_string(interval_));
  if (warmup_ < 0) throw InvalidArgument(name + ": warmup_steps must be >= 0, got " + std::to_string(warmup_));
  if (!(lr_ > 0.0)) throw InvalidArgument(name + ": outer_lr must be > 0, got " + number_text(lr_));
  if (!(momentum_ >= 0.0 && momentum_ < 1.0))
    throw InvalidArgument(name + ": outer_momentum must be in [0, 1), got " + number_text(momentum_));
  if (hierarchical_) comms_.check_hierarchical(name);
  fragments_ = params.get_int(name, "num_fragments", 1);
  overlap_ = params.get_int(name, "overlap_steps", 0);
  mixing_ = params.get_double(name, "mixing", 0.0);
  if (fragments_ < 1 || fragments_ > interval_)
    throw InvalidArgument(name + ": num_fragments must be in [1, sync_interval=" + std::to_string(interval_) +
                          "] (each fragment synchronises at its own step), got " + std::to_string(fragments_));
  if (overlap_ < 0 || overlap_ >= interval_)
    throw InvalidArgument(name + ": overlap_steps must be in [0, sync_interval=" + std::to_string(interval_) +
                          ") (an exchange must land before its fragment's next one starts), got " +
                          std::to_string(overlap_));
  if (!(mixing_ >= 0.0 && mixing_ <= 1.0))
    throw InvalidArgument(name + ": mixing must be in [0, 1], got " + number_text(mixing_));
  if (overlap_ > 0 && hierarchical_)
    throw InvalidArgument(name +
                          ": overlap_steps > 0 runs the exchange among all ranks; hierarchical=true is not "
                          "supported with it");
}

std::string LocalStepsStep::describe() const {
  return "local_steps(sync_interval=" + std::to_string(interval_) + ", warmup_steps=" + std::to_string(warmup_) +
         ", outer_lr=" + number_text(lr_) + ", outer_momentum=" + number_text(momentum_) +
         ", nesterov=" + (nesterov_ ? "true" : "false") + ", hierarchical=" + (hierarchical_ ? "true" : "false") +
         (compressed_ ? ", compression=" + codec_->name() : "") +
         (compressed_ && codec_->sparse() ? ", topk_k=" + std::to_string(codec_->topk_k()) + "/256" : "") +
         (error_feedback_ ? ", error_feedback=true" : "") +
         (fragments_ > 1 ? ", num_fragments=" + std::to_string(fragments_) : "") +
         (overlap_ > 0 ? ", overlap_steps=" + std::to_string(overlap_) : "") +
         (mixing_ > 0.0 ? ", mixing=" + number_text(mixing_) : "") + ")";
}

void LocalStepsStep::check(DType dtype, size_t count) const {
  if (!is_floating(dtype))
    throw InvalidArgument(describe() + ": weights of " + dtype_name(dtype) + "; the outer step needs a floating dtype");
  Step::check(dtype, count);
}

int64_t LocalStepsStep::offset(int64_t p) const { return p * interval_ / fragments_; }

bool LocalStepsStep::starts(int64_t p, int64_t t) const { return t >= 1 && (t + offset(p)) % interval_ == 0; }

bool LocalStepsStep::communicates(int64_t step) const {
  if (step < warmup_) return true;
  const int64_t t = step - warmup_ + 1;
  for (int64_t p = 0; p < fragments_; ++p)
    if (starts(p, t) || (overlap_ > 0 && starts(p, t - overlap_))) return true;
  return false;
}

bool LocalStepsStep::run(const ExecContext&, Span, Span, int64_t) const {
  throw InvalidArgument(describe() + ": needs its anchor and momentum; run it through run_with_state()");
}

void LocalStepsStep::average(const ExecContext& ctx, Span data, bool compress, const Span* error) const {
  average_over(comms_, compress ? codec_ : std::nullopt, hierarchical_, ctx, data, error);
}

void LocalStepsStep::refuse_nonfinite(const ExecContext& ctx, Span data, const Span& anchor, size_t mine_bad,
                                      const Span* weights) const {
  // Every exchange carries NaN and Inf through (the codecs decode a non-finite block to NaN), so
  // the average is non-finite on every rank exactly when some rank's pseudo-gradient was: all
  // ranks raise at the same step, and none waits for a peer.
  if (step_kernels::count_nonfinite(ctx, data.data, data.count, data.dtype, kCountSlot) == 0) return;
  const Span& w = weights ? *weights : data;
  step_kernels::copy(ctx, w.data, anchor.data, w.nbytes());  // the weights of the last synchronisation
  const std::string whose = mine_bad > 0 ? "this rank's own holds " + std::to_string(mine_bad) + " of its " +
                                               std::to_string(data.count) + " values"
                                         : "this rank's own is finite: the NaN or Inf came from another rank";
  throw Error(describe() + ": NaN or Inf in the pseudo-gradient on rank " + std::to_string(comms_.global->rank()) +
              " (" + whose + "); these weights are back at the last synchronisation and nothing was applied to them");
}

bool LocalStepsStep::run_with_state(const ExecContext& ctx, Span data, Span, const std::vector<Span>& state,
                                    int64_t step) const {
  if (state.size() != static_cast<size_t>(num_state()))
    throw InvalidArgument(describe() + ": needs " + std::to_string(num_state()) +
                          " state spans (the anchor, the outer momentum" + (error_feedback_ ? ", the residual)" : ")"));
  for (const Span& s : state) {
    if (s.count != data.count || s.dtype != data.dtype)
      throw InvalidArgument(describe() + ": its state spans must have the weights' size and dtype");
  }
  const std::string bucket = overlap_ > 0 && step >= warmup_ ? flight_bucket(data, step) : std::string();
  if (!communicates(step)) return false;
  const Span& anchor = state[0];
  const Span& momentum = state[1];
  if (step < warmup_) {
    average(ctx, data, false, nullptr);
    step_kernels::copy(ctx, anchor.data, data.data, data.nbytes());
    return true;
  }
  const int64_t t = step - warmup_ + 1;
  if (overlap_ > 0 && ctx.device != DeviceType::kCPU)
    throw InvalidArgument(describe() +
                          ": overlap_steps > 0 runs on CPU buckets only (its in-flight exchanges live "
                          "in host memory); use overlap_steps=0 on a device");
  if (overlap_ > 0 && ctx.dev != nullptr)
    throw InvalidArgument(describe() + ": overlap_steps > 0 runs on plain host buckets only, not on a Device");
  const size_t per = data.count / static_cast<size_t>(fragments_);
  auto slice = [&](const Span& sp, int64_t p) {
    return Span{static_cast<char*>(sp.data) + static_cast<size_t>(p) * per * dtype_size(sp.dtype), per, sp.dtype};
  };
  for (int64_t p = 0; p < fragments_; ++p)  // exchanges started overlap_ steps ago land first
    if (overlap_ > 0 && starts(p, t - overlap_))
      land(ctx, slice(data, p), slice(state[0], p), slice(state[1], p), error_feedback_ ? slice(state[2], p) : Span{},
           t - overlap_ + offset(p) == interval_, bucket + "/" + std::to_string(p), step - overlap_);
  for (int64_t p = 0; p < fragments_; ++p) {
    if (!starts(p, t)) continue;
    const bool fresh = t + offset(p) == interval_;
    const Span d = slice(data, p), a = slice(state[0], p), m = slice(state[1], p);
    const Span e = error_feedback_ ? slice(state[2], p) : Span{};
    if (overlap_ == 0) {
      sync_now(ctx, d, a, m, e, fresh);
    } else {
      launch(d, a, e, fresh, bucket + "/" + std::to_string(p), step);
    }
  }
  return true;
}

void LocalStepsStep::sync_now(const ExecContext& ctx, Span data, const Span& anchor, const Span& momentum,
                              const Span& residual, bool fresh) const {
  const Span* error = residual.data ? &residual : nullptr;
  if (error && fresh) step_kernels::fill_zero(ctx, error->data, error->nbytes());
  if (mixing_ == 0.0) {  // the pseudo-gradient in place of the weights, which become the new anchor
    step_kernels::pseudo_gradient(ctx, data.data, anchor.data, data.count, data.dtype);
    const size_t mine_bad = step_kernels::count_nonfinite(ctx, data.data, data.count, data.dtype, kCountSlot);
    try {
      average(ctx, data, compressed_, error);
    } catch (...) {
      // the weights became the pseudo-gradient, part-averaged: back to the last synchronisation
      step_kernels::copy(ctx, data.data, anchor.data, data.nbytes());
      throw;
    }
    refuse_nonfinite(ctx, data, anchor, mine_bad);
    step_kernels::outer_sgd(ctx, data.data, anchor.data, momentum.data, data.data, data.count, data.dtype, lr_,
                            momentum_, nesterov_, fresh);
    return;
  }
  // mixing: the local weights stay until the merge; the pseudo-gradient goes to scratch
  Span d{ctx.scratch->get(kMixSlot, data.nbytes()), data.count, data.dtype};
  step_kernels::copy(ctx, d.data, data.data, data.nbytes());
  step_kernels::pseudo_gradient(ctx, d.data, anchor.data, d.count, d.dtype);
  const size_t mine_bad = step_kernels::count_nonfinite(ctx, d.data, d.count, d.dtype, kCountSlot);
  average(ctx, d, compressed_, error);
  refuse_nonfinite(ctx, d, anchor, mine_bad, &data);
  step_kernels::outer_sgd(ctx, d.data, anchor.data, momentum.data, d.data, d.count, d.dtype, lr_, momentum_, nesterov_,
                          fresh);
  step_kernels::outer_mix(ctx, data.data, d.data, data.count, data.dtype, mixing_);
}

}  // namespace bagua
