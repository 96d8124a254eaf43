#include "sched/async_weights.h"

#include <cstring>
#include <string>
#include <utility>

#include "common/error.h"
#include "common/handle_table.h"
#include "ops/elementwise.h"

namespace bagua {
namespace {

HandleTable<AsyncWeights>& table() {
  static auto* t =
      new HandleTable<AsyncWeights>("asynchronous model average");  // never destroyed: XLA may call at exit
  return *t;
}

// Releases the weight lock however the step ends.
class WeightLock {
 public:
  explicit WeightLock(AsyncAverager& a) : a_(a) { a_.lock_weights(); }
  ~WeightLock() { a_.unlock_weights(); }
  WeightLock(const WeightLock&) = delete;
  WeightLock& operator=(const WeightLock&) = delete;

 private:
  AsyncAverager& a_;
};

}  // namespace

AsyncWeights::AsyncWeights(std::shared_ptr<AsyncAverager> averager, std::vector<Leaf> leaves, int64_t warmup_steps)
    : averager_(std::move(averager)), leaves_(std::move(leaves)), warmup_steps_(warmup_steps) {
  if (!averager_) throw InvalidArgument("AsyncWeights: no averager");
  if (leaves_.empty()) throw InvalidArgument("AsyncWeights: no leaves");
  if (warmup_steps_ < 0) throw InvalidArgument("AsyncWeights: warmup_steps must be >= 0");
  for (const Leaf& l : leaves_) {
    if (!l.bucket) throw InvalidArgument("AsyncWeights: a leaf's bucket is None");
    if (l.bucket->device()) throw InvalidArgument("AsyncWeights: the weights must be in host memory");
    (void)l.bucket->slot(l.slot);  // throws when out of range
  }
}

Span AsyncWeights::leaf(size_t i) const {
  const Leaf& l = leaves_.at(i);
  return Span{l.bucket->slot_data(l.slot), static_cast<size_t>(l.bucket->slot(l.slot).numel), l.bucket->dtype()};
}

void AsyncWeights::check(const std::vector<Span>& spans, const char* what) const {
  if (spans.size() != leaves_.size())
    throw InvalidArgument(std::string("asynchronous model average: ") + std::to_string(spans.size()) + " " + what +
                          " leaves for " + std::to_string(leaves_.size()) + " weights");
  for (size_t i = 0; i < spans.size(); ++i) {
    const Span w = leaf(i);
    if (spans[i].count != w.count || spans[i].dtype != w.dtype)
      throw InvalidArgument(std::string("asynchronous model average: ") + what + " leaf " + std::to_string(i) + " is " +
                            std::to_string(spans[i].count) + " x " + dtype_name(spans[i].dtype) + ", the weights' is " +
                            std::to_string(w.count) + " x " + dtype_name(w.dtype));
  }
}

void AsyncWeights::step(int64_t number, const std::vector<Span>& params, const std::vector<Span>& updates,
                        const std::vector<Span>& out) {
  check(params, "params");
  check(updates, "update");
  check(out, "result");
  if (number < warmup_steps_) {
    WeightLock lock(*averager_);
    for (size_t i = 0; i < leaves_.size(); ++i) {
      const Span w = leaf(i);
      async_warmup_step_cpu(w.data, params[i].data, updates[i].data, w.count, w.dtype);
      if (out[i].data != updates[i].data) std::memcpy(out[i].data, updates[i].data, out[i].nbytes());
    }
    return;
  }
  if (!started_.exchange(true)) averager_->start();
  WeightLock lock(*averager_);
  for (size_t i = 0; i < leaves_.size(); ++i) {
    const Span w = leaf(i);
    async_local_step_cpu(w.data, params[i].data, updates[i].data, out[i].data, w.count, w.dtype);
  }
}

int64_t register_async_weights(std::shared_ptr<AsyncWeights> weights) { return table().add(std::move(weights)); }

void rebind_async_weights(int64_t handle, std::shared_ptr<AsyncWeights> weights) {
  table().set(handle, std::move(weights));
}

std::shared_ptr<AsyncWeights> lookup_async_weights(int64_t handle) {
  auto weights = table().get(handle, " (was the transform's algorithm freed?)");
  if (!weights) throw InvalidArgument("asynchronous model average: no weights bound yet (call init first)");
  return weights;
}

void unregister_async_weights(int64_t handle) { table().remove(handle); }

}  // namespace bagua
