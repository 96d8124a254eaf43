#include "ffi/xla_step_adapter.h"

#include <cstring>
#include <string>

#include "common/error.h"
#include "ops/kernels.h"
#include "ops/registry.h"

namespace bagua {
namespace ffi {
namespace {

enum BucketSlot { kDataSlot = 0, kResultSlot = 1, kStateSlot = 2 };

CommunicatorPtr optional_communicator(int64_t handle, DeviceType device) {
  return handle < 0 ? nullptr : communicator_for(handle, device);
}

// Operand and result `i` as spans of `dtype`, checked to be alike.
Span arg_span(const Step& s, const xffi::RemainingArgs& args, size_t i, DType dtype, const char* what) {
  auto buffer = args.get<xffi::AnyBuffer>(i);
  if (!buffer)
    throw InvalidArgument(s.describe() + ": operand " + std::to_string(i) + " (" + what + ") is not a buffer");
  DType d;
  if (!to_engine_dtype(buffer->element_type(), &d) || d != dtype)
    throw InvalidArgument(s.describe() + ": operand " + std::to_string(i) + " (" + what +
                          ") has another dtype than the bucket's first leaf");
  return Span{buffer->untyped_data(), buffer->element_count(), dtype};
}

Span ret_span(const Step& s, const xffi::RemainingRets& rets, size_t i, const Span& like, const char* what) {
  auto buffer = rets.get<xffi::AnyBuffer>(i);
  if (!buffer)
    throw InvalidArgument(s.describe() + ": result " + std::to_string(i) + " (" + what + ") is not a buffer");
  DType d;
  if (!to_engine_dtype((*buffer)->element_type(), &d) || d != like.dtype || (*buffer)->element_count() != like.count)
    throw InvalidArgument(s.describe() + ": result " + std::to_string(i) + " (" + what +
                          ") differs in dtype or size from its operand");
  return Span{(*buffer)->untyped_data(), like.count, like.dtype};
}

// The first `n` operands' shapes, back to back: the bucket's layout
// (ops/algorithm_step.h). Operands that are no buffers are left to the checks below.
BucketLayout leaf_layout(const xffi::RemainingArgs& args, size_t n) {
  BucketLayout out;
  size_t offset = 0;
  for (size_t i = 0; i < n && i < args.size(); ++i) {
    auto buffer = args.get<xffi::AnyBuffer>(i);
    if (!buffer) break;
    const auto dims = buffer->dimensions();
    TensorLayout t{offset, buffer->element_count(), std::vector<int64_t>(dims.begin(), dims.end())};
    offset += t.numel;
    out.push_back(std::move(t));
  }
  return out;
}

size_t total_count(const std::vector<Span>& leaves) {
  size_t n = 0;
  for (const Span& s : leaves) n += s.count;
  return n;
}

// One unpadded leaf is its own bucket: no gathering needed.
bool is_own_bucket(const std::vector<Span>& leaves, size_t padded) {
  return leaves.size() == 1 && leaves[0].count == padded;
}

// The bucket the step works on in place: `out` itself when it is one
// unpadded leaf (holding `in` after a copy), else scratch gathered from `in`
// with the padding zeroed.
Span working_bucket(const ExecContext& ctx, Scratch& buckets, const std::vector<Span>& in, const std::vector<Span>& out,
                    size_t padded, DType dtype, BucketSlot slot) {
  if (is_own_bucket(out, padded)) {
    if (out[0].data != in[0].data) step_kernels::copy(ctx, out[0].data, in[0].data, in[0].nbytes());
    return out[0];
  }
  const size_t elem = dtype_size(dtype);
  char* bucket = static_cast<char*>(buckets.get(slot, padded * elem));
  size_t offset = 0;
  for (const Span& leaf : in) {
    step_kernels::copy(ctx, bucket + offset, leaf.data, leaf.nbytes());
    offset += leaf.nbytes();
  }
  step_kernels::fill_zero(ctx, bucket + offset, padded * elem - offset);
  return Span{bucket, padded, dtype};
}

// Copies `bucket` back into the leaves `out` unless it is their own memory.
void scatter(const ExecContext& ctx, const Span& bucket, const std::vector<Span>& out) {
  if (is_own_bucket(out, bucket.count) && out[0].data == bucket.data) return;
  const char* src = static_cast<const char*>(bucket.data);
  for (const Span& leaf : out) {
    step_kernels::copy(ctx, leaf.data, src, leaf.nbytes());
    src += leaf.nbytes();
  }
}

}  // namespace

StepMemory::StepMemory(DevicePtr device) : step(device), buckets(device), device_(std::move(device)) {}

void check_step_operand(const xffi::AnyBuffer& step) {
  if (step.element_count() != 1) throw InvalidArgument("the step number must be a scalar");
  if (step.element_type() != xffi::DataType::S32 && step.element_type() != xffi::DataType::S64)
    throw InvalidArgument("the step number must be int32 or int64");
}

int64_t step_value(const void* data, xffi::DataType type) {
  int64_t value = 0;
  if (type == xffi::DataType::S32) {
    int32_t v = 0;
    std::memcpy(&v, data, sizeof v);
    value = v;
  } else {
    std::memcpy(&value, data, sizeof value);
  }
  if (value < 0) throw InvalidArgument("the step number must be >= 0, got " + std::to_string(value));
  return value;
}

int64_t read_host_step(const xffi::AnyBuffer& step) {
  check_step_operand(step);
  return step_value(step.untyped_data(), step.element_type());
}

PreparedStep prepare_step(const Platform& p, std::string_view name, std::string_view params, int64_t comm,
                          int64_t intra, int64_t inter, int64_t n_data, xffi::AnyBuffer step,
                          const xffi::RemainingArgs& args, const xffi::RemainingRets& rets) {
  CommSet comms{communicator_for(comm, p.device), optional_communicator(intra, p.device),
                optional_communicator(inter, p.device)};
  const size_t n = n_data > 0 ? static_cast<size_t>(n_data) : 0;
  StepPtr s = make_step(std::string(name), comms, StepParams::parse(std::string(params)), leaf_layout(args, n));
  if (n == 0 || args.size() < n)
    throw InvalidArgument(s->describe() + ": a bucket needs at least one leaf, got n_data=" + std::to_string(n_data) +
                          " with " + std::to_string(args.size()) + " operands");
  if (rets.size() != args.size())
    throw InvalidArgument(s->describe() + ": " + std::to_string(args.size()) + " operands but " +
                          std::to_string(rets.size()) + " results");

  check_step_operand(step);
  PreparedStep call;
  call.step = s;
  call.platform = p;
  auto first = args.get<xffi::AnyBuffer>(0);
  if (!first || !to_engine_dtype(first->element_type(), &call.dtype))
    throw InvalidArgument(s->describe() + ": unsupported element type");
  for (size_t i = 0; i < n; ++i) {
    call.data_in.push_back(arg_span(*s, args, i, call.dtype, "data"));
    call.data_out.push_back(ret_span(*s, rets, i, call.data_in.back(), "data"));
  }
  const size_t alignment = s->alignment();
  call.padded = (total_count(call.data_in) + alignment - 1) / alignment * alignment;
  s->check(call.dtype, call.padded);
  if (s->has_result()) {
    for (size_t i = 0; i < n; ++i)
      if (call.data_out[i].data == call.data_in[i].data)
        throw InvalidArgument(s->describe() + ": the result must not alias the weights");
  }

  const size_t n_state_args = args.size() - n;
  const int n_state = s->num_state();
  if (n_state == 0 && n_state_args != 0)
    throw InvalidArgument(s->describe() + " keeps no state, got " + std::to_string(n_state_args) + " state operands");
  if (n_state > 0) {
    if (s->has_result()) throw InvalidArgument(s->describe() + ": stateful steps work in place");
    const StateLayout layout = s->state_layout(call.dtype, call.padded);
    if (n_state_args == 1) {
      call.state_block_in = arg_span(*s, args, n, layout.dtype, "state");
      call.state_block_out = ret_span(*s, rets, n, call.state_block_in, "state");
      if (call.state_block_in.count != layout.count())
        throw InvalidArgument(s->describe() + ": the state must hold " + std::to_string(layout.spans) + " x " +
                              std::to_string(layout.span_count) + " elements, got " +
                              std::to_string(call.state_block_in.count));
    } else if (n_state_args == n && n_state == 1 && layout.data_shaped) {
      for (size_t i = 0; i < n; ++i) {
        call.state_in.push_back(arg_span(*s, args, n + i, call.dtype, "state"));
        if (call.state_in.back().count != call.data_in[i].count)
          throw InvalidArgument(s->describe() + ": state leaf " + std::to_string(i) +
                                " differs in size from its data leaf");
        call.state_out.push_back(ret_span(*s, rets, n + i, call.state_in.back(), "state"));
      }
    } else {
      throw InvalidArgument(s->describe() + " keeps " + std::to_string(n_state) +
                            " state spans: pass one state block or (for one span) one state leaf per data leaf, got " +
                            std::to_string(n_state_args) + " state operands for " + std::to_string(n) + " leaves");
    }
  }
  return call;
}

void run_prepared(const PreparedStep& call, StepMemory& memory) {
  const ExecContext ctx = call.platform.context(&memory.step);
  Scratch& buckets = memory.buckets;
  const Step& step = *call.step;

  std::vector<Span> state;
  Span state_bucket;
  if (call.state_block_out.count > 0) {
    if (call.state_block_out.data != call.state_block_in.data)
      step_kernels::copy(ctx, call.state_block_out.data, call.state_block_in.data, call.state_block_in.nbytes());
    const StateLayout layout = step.state_layout(call.dtype, call.padded);
    state = state_spans(call.state_block_out.data, layout.spans, layout.span_count, layout.dtype);
    if (layout
            .data_shaped) {  // the spans' padding is zeroed as the engine's StepOp does (ByteGrad's residual has some)
      const size_t payload = total_count(call.data_in) * dtype_size(call.dtype);
      for (const Span& sp : state)
        step_kernels::fill_zero(ctx, static_cast<char*>(sp.data) + payload, sp.nbytes() - payload);
    }
  } else if (!call.state_in.empty()) {
    state_bucket = working_bucket(ctx, buckets, call.state_in, call.state_out, call.padded, call.dtype, kStateSlot);
    state = {state_bucket};
  }

  if (!step.has_result()) {
    const Span bucket = working_bucket(ctx, buckets, call.data_in, call.data_out, call.padded, call.dtype, kDataSlot);
    step.run_with_state(ctx, bucket, bucket, state, call.number);
    scatter(ctx, bucket, call.data_out);
  } else {
    // the weights are only read: one unpadded leaf is used as it is
    const Span data =
        is_own_bucket(call.data_in, call.padded)
            ? call.data_in[0]
            : working_bucket(ctx, buckets, call.data_in, call.data_in, call.padded, call.dtype, kDataSlot);
    const Span result =
        is_own_bucket(call.data_out, call.padded)
            ? call.data_out[0]
            : Span{buckets.get(kResultSlot, call.padded * dtype_size(call.dtype)), call.padded, call.dtype};
    // a weight step that did not communicate hands the weights back unchanged
    scatter(ctx, step.run_with_state(ctx, data, result, state, call.number) ? result : data, call.data_out);
  }
  if (state_bucket.count > 0) scatter(ctx, state_bucket, call.state_out);
}

}  // namespace ffi
}  // namespace bagua
