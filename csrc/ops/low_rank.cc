#include "ops/low_rank.h"

#include <algorithm>
#include <cerrno>
#include <cstdlib>

#include "ops/elementwise.h"
#include "ops/kernels.h"
#include "ops/low_rank_kernels.h"
#include "ops/low_rank_math.h"

namespace bagua {
namespace {

const char* const kName = "low_rank";
enum ScratchSlot { kPSlot = 0, kUncompressedSlot = 1 };

// A decimal >= 0 given as a string (the form StepParams carries floats in).
double parse_decimal(const std::string& key, const std::string& text) {
  char* end = nullptr;
  errno = 0;
  const double v = std::strtod(text.c_str(), &end);
  if (text.empty() || *end != '\0' || errno != 0 || !(v >= 0.0) || v > 1e300)
    throw InvalidArgument(std::string(kName) + ": " + key + " must be a decimal >= 0, got '" + text + "'");
  return v;
}

char* at(void* base, size_t elements, DType dtype) { return static_cast<char*>(base) + elements * dtype_size(dtype); }

}  // namespace

LowRankStep::LowRankStep(CommSet comms, const StepParams& params, BucketLayout layout)
    : comms_(std::move(comms)), layout_(std::move(layout)) {
  params.check_known(kName, {"rank", "start_iter", "min_compression_rate", "orthogonalization_epsilon",
                             "error_feedback", "warm_start", "seed"});
  rank_ = params.get_int(kName, "rank", 4);
  start_iter_ = params.get_int(kName, "start_iter", 1000);
  min_compression_rate_text_ = params.get_string(kName, "min_compression_rate", "2");
  epsilon_text_ = params.get_string(kName, "orthogonalization_epsilon", "0");
  error_feedback_ = params.get_bool(kName, "error_feedback", true);
  warm_start_ = params.get_bool(kName, "warm_start", true);
  seed_ = params.get_int(kName, "seed", 0);
  if (!comms_.global) throw InvalidArgument(std::string(kName) + ": no communicator");
  if (rank_ < 1) throw InvalidArgument(std::string(kName) + ": rank must be >= 1, got " + std::to_string(rank_));
  if (start_iter_ < 0)
    throw InvalidArgument(std::string(kName) + ": start_iter must be >= 0, got " + std::to_string(start_iter_));
  if (seed_ < 0) throw InvalidArgument(std::string(kName) + ": seed must be >= 0, got " + std::to_string(seed_));
  min_compression_rate_ = parse_decimal("min_compression_rate", min_compression_rate_text_);
  epsilon_ = parse_decimal("orthogonalization_epsilon", epsilon_text_);

  size_t end = 0;
  for (size_t t = 0; t < layout_.size(); ++t) {
    const TensorLayout& tl = layout_[t];
    int64_t product = 1;
    for (int64_t d : tl.shape) {
      if (d < 0) throw InvalidArgument(describe() + ": tensor " + std::to_string(t) + " has a negative dimension");
      product *= d;
    }
    if (static_cast<size_t>(product) != tl.numel)
      throw InvalidArgument(describe() + ": tensor " + std::to_string(t) + "'s shape does not hold its " +
                            std::to_string(tl.numel) + " elements");
    if (tl.offset < end)
      throw InvalidArgument(describe() + ": the layout's tensors must follow each other without overlapping");
    end = tl.offset + tl.numel;
    Part part{t, tl.offset, tl.numel, false, 0, 0, 0, 0, 0};
    if (tl.shape.size() >= 2 && tl.numel > 0) {
      const size_t n = static_cast<size_t>(tl.shape[0]);
      const size_t m = tl.numel / n;
      const size_t r = std::min({n, m, static_cast<size_t>(rank_)});
      // torch's _should_compress
      if (static_cast<double>((n + m) * r) * min_compression_rate_ < static_cast<double>(n * m)) {
        part.compressed = true;
        part.n = n, part.m = m, part.r = r;
        part.p_offset = p_count_, part.q_offset = q_count_;
        p_count_ += n * r;
        q_count_ += m * r;
      }
    }
    if (!part.compressed) {
      uncompressed_count_ += tl.numel;
      if (!runs_.empty() && runs_.back().offset + runs_.back().numel == tl.offset)
        runs_.back().numel += tl.numel;
      else
        runs_.push_back(Run{tl.offset, tl.numel});
    }
    parts_.push_back(part);
  }
}

std::string LowRankStep::describe() const {
  return std::string(kName) + "(rank=" + std::to_string(rank_) + ", start_iter=" + std::to_string(start_iter_) +
         ", min_compression_rate=" + min_compression_rate_text_ + ", orthogonalization_epsilon=" + epsilon_text_ +
         ", error_feedback=" + (error_feedback_ ? "true" : "false") +
         ", warm_start=" + (warm_start_ ? "true" : "false") + ", seed=" + std::to_string(seed_) + ")";
}

void LowRankStep::check(DType dtype, size_t count) const {
  if (!is_floating(dtype))
    throw InvalidArgument(describe() + ": gradients of " + dtype_name(dtype) +
                          "; low-rank compression needs float32, float64, float16 or bfloat16");
  if (count > 0 && layout_.empty())
    throw InvalidArgument(describe() + ": needs the shapes of the bucket's tensors (make it with the bucket's layout)");
  if (!layout_.empty() && layout_.back().offset + layout_.back().numel > count)
    throw InvalidArgument(describe() + ": the layout's tensors end after the bucket's " + std::to_string(count) +
                          " elements");
  Step::check(dtype, count);
}

StateLayout LowRankStep::state_layout(DType dtype, size_t count) const {
  return StateLayout{1, (error_feedback_ ? count : 0) + q_count_, step_kernels::low_rank_compute_dtype(dtype),
                     StateInit::kZero, false};
}

bool LowRankStep::run(const ExecContext&, Span, Span, int64_t) const {
  throw InvalidArgument(describe() + ": needs its error memory and Q; run it through run_with_state()");
}

bool LowRankStep::run_with_state(const ExecContext& ctx, Span data, Span, const std::vector<Span>& state,
                                 int64_t step) const {
  if (data.count == 0) return true;
  if (step < start_iter_) {
    comms_.global->allreduce(data.data, data.data, data.count, data.dtype, ReduceOp::kAvg, ctx.stream);
    return true;
  }
  check(data.dtype, data.count);
  const StateLayout sl = state_layout(data.dtype, data.count);
  if (sl.count() > 0 &&
      (state.size() != 1 || state[0].count != sl.span_count || state[0].dtype != sl.dtype || !state[0].data))
    throw InvalidArgument(describe() + ": needs one state span of " + std::to_string(sl.span_count) + " " +
                          dtype_name(sl.dtype) + " elements (the error memory, then Q)");
  const DType compute = sl.dtype;
  void* block = sl.count() > 0 ? state[0].data : nullptr;
  void* error = error_feedback_ ? block : nullptr;
  char* q_all = error_feedback_ ? at(block, data.count, compute) : static_cast<char*>(block);

  const size_t item = dtype_size(data.dtype);
  // Error feedback on the uncompressed tensors here; the products fold and finish the matrices' in
  // their own passes over them.
  if (error)
    for (const Run& u : runs_)
      step_kernels::low_rank_fold_error(ctx, at(data.data, u.offset, data.dtype), at(error, u.offset, compute), u.numel,
                                        data.dtype);

  if (runs_.size() == 1) {
    comms_.global->allreduce(at(data.data, runs_[0].offset, data.dtype), at(data.data, runs_[0].offset, data.dtype),
                             runs_[0].numel, data.dtype, ReduceOp::kAvg, ctx.stream);
  } else if (runs_.size() > 1) {  // gathered into one allreduce
    char* buffer = static_cast<char*>(ctx.scratch->get(kUncompressedSlot, uncompressed_count_ * item));
    size_t filled = 0;
    for (const Run& u : runs_) {
      step_kernels::copy(ctx, at(buffer, filled, data.dtype), at(data.data, u.offset, data.dtype), u.numel * item);
      filled += u.numel;
    }
    comms_.global->allreduce(buffer, buffer, uncompressed_count_, data.dtype, ReduceOp::kAvg, ctx.stream);
    filled = 0;
    for (const Run& u : runs_) {
      step_kernels::copy(ctx, at(data.data, u.offset, data.dtype), at(buffer, filled, data.dtype), u.numel * item);
      filled += u.numel;
    }
  }

  if (p_count_ > 0) {
    char* p_all = static_cast<char*>(ctx.scratch->get(kPSlot, p_count_ * dtype_size(compute)));
    const bool fresh = !warm_start_ || step == start_iter_;
    for (const Part& p : parts_) {
      if (!p.compressed) continue;
      char* q = at(q_all, p.q_offset, compute);
      if (fresh)
        step_kernels::low_rank_initial_q(ctx, q, p.m * p.r, compute,
                                         low_rank::init_key(static_cast<uint64_t>(seed_), static_cast<uint64_t>(step),
                                                            static_cast<uint64_t>(p.tensor)));
      step_kernels::low_rank_orthogonalize(ctx, q, p.m, p.r, compute, epsilon_);
      step_kernels::low_rank_mq(ctx, at(data.data, p.offset, data.dtype), p.n, p.m, q, p.r,
                                at(p_all, p.p_offset, compute), data.dtype,
                                error ? at(error, p.offset, compute) : nullptr);
    }
    comms_.global->allreduce(p_all, p_all, p_count_, compute, ReduceOp::kSum, ctx.stream);
    for (const Part& p : parts_) {
      if (!p.compressed) continue;
      char* pm = at(p_all, p.p_offset, compute);
      step_kernels::low_rank_orthogonalize(ctx, pm, p.n, p.r, compute, epsilon_);
      step_kernels::low_rank_mtp(ctx, at(data.data, p.offset, data.dtype), p.n, p.m, pm, p.r,
                                 at(q_all, p.q_offset, compute), data.dtype);
    }
    comms_.global->allreduce(q_all, q_all, q_count_, compute, ReduceOp::kAvg, ctx.stream);
    for (const Part& p : parts_) {
      if (!p.compressed) continue;
      step_kernels::low_rank_pqt(ctx, at(p_all, p.p_offset, compute), at(q_all, p.q_offset, compute), p.n, p.m, p.r,
                                 at(data.data, p.offset, data.dtype), data.dtype,
                                 error ? at(error, p.offset, compute) : nullptr);
    }
  }

  if (error)
    for (const Run& u : runs_)
      step_kernels::low_rank_finish_error(ctx, at(data.data, u.offset, data.dtype), at(error, u.offset, compute),
                                          u.numel, data.dtype);
  return true;
}

}  // namespace bagua
