#include "ops/halfgrad.h"

#include <vector>

#include "ops/elementwise.h"
#include "ops/hierarchical.h"
#include "ops/kernels.h"

namespace bagua {
namespace {

void scatter_reduce_gather(Communicator& c, const ExecContext& ctx, Span data, DType wire, bool average) {
  const size_t n = static_cast<size_t>(c.size());
  const size_t r = static_cast<size_t>(c.rank());
  const size_t chunk = data.count / n;
  const size_t record = chunk * dtype_size(wire);
  uint8_t* send = static_cast<uint8_t*>(ctx.scratch->get(0, n * record));
  uint8_t* recv = static_cast<uint8_t*>(ctx.scratch->get(1, n * record));
  void* mine = static_cast<uint8_t*>(data.data) + r * chunk * dtype_size(data.dtype);

  // 1-2. My own record goes straight to its place in `recv`.
  step_kernels::wire_encode(ctx, data.data, data.count, data.dtype, wire, send);
  step_kernels::copy(ctx, recv + r * record, send + r * record, record);
  std::vector<size_t> counts(n, record), displs(n);
  for (size_t p = 0; p < n; ++p) displs[p] = p * record;
  counts[r] = 0;
  c.alltoall_v(send, counts, displs, recv, counts, displs, DType::kUInt8, ctx.stream);
  // 3-4.
  step_kernels::wire_reduce(ctx, recv, chunk, n, wire, data.dtype, average, mine);
  step_kernels::wire_encode(ctx, mine, chunk, data.dtype, wire, send + r * record);
  // 5-6.
  c.allgather(send + r * record, send, record, DType::kUInt8, ctx.stream);
  step_kernels::wire_decode(ctx, send, data.count, wire, data.dtype, data.data);
}

}  // namespace

HalfGradStep::HalfGradStep(CommSet comms, const StepParams& params) : comms_(std::move(comms)) {
  const std::string name = "halfgrad";
  params.check_known(name, {"hierarchical", "average", "wire"});
  hierarchical_ = params.get_bool(name, "hierarchical", false);
  average_ = params.get_bool(name, "average", true);
  const std::string wire = params.get_string(name, "wire", "float16");
  if (wire == "float16")
    wire_ = DType::kFloat16;
  else if (wire == "bfloat16")
    wire_ = DType::kBFloat16;
  else
    throw InvalidArgument(name + ": wire must be \"float16\" or \"bfloat16\", got \"" + wire + "\"");
  if (!comms_.global) throw InvalidArgument(name + ": no communicator");
  if (hierarchical_) comms_.check_hierarchical(name);
}

std::string HalfGradStep::describe() const {
  return std::string("halfgrad(hierarchical=") + (hierarchical_ ? "true" : "false") +
         ", average=" + (average_ ? "true" : "false") + ", wire=" + dtype_name(wire_) + ")";
}

void HalfGradStep::check(DType dtype, size_t count) const {
  if (!is_floating(dtype))
    throw InvalidArgument(describe() + ": data of " + dtype_name(dtype) +
                          "; a 16-bit wire carries float32, float64, float16 or bfloat16");
  Step::check(dtype, count);
}

bool HalfGradStep::run(const ExecContext& ctx, Span data, Span, int64_t) const {
  run_centralized(comms_, ctx, hierarchical_, data, average_ ? ReduceOp::kAvg : ReduceOp::kSum,
                  [&](Communicator& c) { scatter_reduce_gather(c, ctx, data, wire_, average_); });
  return true;
}

}  // namespace bagua
