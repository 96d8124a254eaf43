#include "ffi/collectives.h"

#include <string>

#include "common/error.h"
#include "ops/kernels.h"

namespace bagua {
namespace ffi {
namespace {

DType engine_dtype(const xffi::AnyBuffer& b) {
  DType t;
  if (!to_engine_dtype(b.element_type(), &t)) {
    throw InvalidArgument("unsupported element type (XLA type " + std::to_string(static_cast<int>(b.element_type())) +
                          "); use float32, float64, float16, bfloat16, int32, int64 or uint8");
  }
  return t;
}

void check_same_type(const xffi::AnyBuffer& in, const xffi::AnyBuffer& out) {
  if (in.element_type() != out.element_type()) {
    throw InvalidArgument("input and output element types differ");
  }
}

}  // namespace

xffi::Error allreduce(const Platform& p, int64_t comm, int64_t op, xffi::AnyBuffer in,
                      xffi::Result<xffi::AnyBuffer> out) {
  return guarded("allreduce", [&] {
    CommunicatorPtr c = communicator_for(comm, p.device);
    if (!is_valid_reduce_op(static_cast<int>(op))) {
      throw InvalidArgument("invalid reduce op " + std::to_string(op));
    }
    check_same_type(in, *out);
    DType dtype = engine_dtype(in);
    size_t count = in.element_count();
    if (out->element_count() != count) {
      throw InvalidArgument("allreduce output has " + std::to_string(out->element_count()) + " elements, input " +
                            std::to_string(count));
    }
    c->allreduce(in.untyped_data(), out->untyped_data(), count, dtype, static_cast<ReduceOp>(op), p.stream);
  });
}

xffi::Error broadcast(const Platform& p, int64_t comm, int64_t root, xffi::AnyBuffer in,
                      xffi::Result<xffi::AnyBuffer> out) {
  return guarded("broadcast", [&] {
    CommunicatorPtr c = communicator_for(comm, p.device);
    if (root < 0 || root >= c->size()) {
      throw InvalidArgument("broadcast root " + std::to_string(root) + " is not a rank of " + c->describe());
    }
    check_same_type(in, *out);
    DType dtype = engine_dtype(in);
    size_t count = in.element_count();
    if (out->element_count() != count) {
      throw InvalidArgument("broadcast output size differs from input");
    }
    // Broadcast works in place: without aliasing, the root's data must first be
    // in the output buffer (other ranks' copies are overwritten anyway).
    void* buf = out->untyped_data();
    if (buf != in.untyped_data() && c->rank() == root && count > 0) {
      step_kernels::copy(p.context(), buf, in.untyped_data(), count * dtype_size(dtype));
    }
    c->broadcast(buf, count, dtype, static_cast<int>(root), p.stream);
  });
}

xffi::Error allgather(const Platform& p, int64_t comm, xffi::AnyBuffer in, xffi::Result<xffi::AnyBuffer> out) {
  return guarded("allgather", [&] {
    CommunicatorPtr c = communicator_for(comm, p.device);
    check_same_type(in, *out);
    DType dtype = engine_dtype(in);
    size_t count = in.element_count();
    size_t want = count * static_cast<size_t>(c->size());
    if (out->element_count() != want) {
      throw InvalidArgument("allgather output has " + std::to_string(out->element_count()) + " elements, expected " +
                            std::to_string(want) + " for " + c->describe());
    }
    c->allgather(in.untyped_data(), out->untyped_data(), count, dtype, p.stream);
  });
}

}  // namespace ffi
}  // namespace bagua
