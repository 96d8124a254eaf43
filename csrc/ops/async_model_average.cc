#include "ops/async_model_average.h"

#include "ops/elementwise.h"
#include "ops/kernels.h"

namespace bagua {

AsyncModelAverageStep::AsyncModelAverageStep(CommSet comms, const StepParams& params) : comms_(std::move(comms)) {
  const std::string name = "async_model_average";
  params.check_known(name, {"peer_selection_mode", "sync_interval_ms"});
  const std::string mode = params.get_string(name, "peer_selection_mode", "all");
  if (mode != "all")
    throw InvalidArgument(name + ": unknown peer_selection_mode '" + mode +
                          "' (asynchronous model average "
                          "supports 'all' only)");
  interval_ms_ = params.get_int(name, "sync_interval_ms", 500);
  if (interval_ms_ < 0)
    throw InvalidArgument(name + ": sync_interval_ms must be >= 0, got " + std::to_string(interval_ms_));
  if (!comms_.global) throw InvalidArgument(name + ": no communicator");
}

std::string AsyncModelAverageStep::describe() const {
  return "async_model_average(peer_selection_mode=all, sync_interval_ms=" + std::to_string(interval_ms_) + ")";
}

void AsyncModelAverageStep::check(DType dtype, size_t count) const {
  if (!is_floating(dtype))
    throw InvalidArgument(describe() + ": weights of " + dtype_name(dtype) +
                          "; weight averaging needs a floating dtype");
}

bool AsyncModelAverageStep::run(const ExecContext& ctx, Span data, Span result, int64_t step) const {
  if (result.data == data.data || result.count != data.count || result.dtype != data.dtype)
    throw InvalidArgument(describe() + ": the result must be a separate buffer of the snapshot's size and dtype");
  comms_.global->allreduce(data.data, result.data, data.count, data.dtype, ReduceOp::kAvg, ctx.stream);
  return true;
}

void AsyncModelAverageStep::apply(const ExecContext& ctx, Span weights, Span snapshot, Span average) const {
  if (snapshot.count != weights.count || average.count != weights.count || snapshot.dtype != weights.dtype ||
      average.dtype != weights.dtype)
    throw InvalidArgument(describe() + ": weights, snapshot and average must have the same size and dtype");
  step_kernels::apply_average(ctx, weights.data, snapshot.data, average.data, weights.count, weights.dtype);
}

bool AsyncModelAverageStep::all_stopped(Communicator& control, bool stopped) const {
  int32_t flag = stopped ? 1 : 0;
  int32_t all = 0;
  control.allreduce(&flag, &all, 1, DType::kInt32, ReduceOp::kMin, nullptr);
  return all != 0;
}

}  // namespace bagua
