// CPU loops over the element math of kernels/reduce.h. Each (dtype, op) pair
// is its own instantiation with a plain loop the compiler can vectorise.
#include <string>
#include <type_traits>

#include "common/error.h"
#include "kernels/reduce.h"

namespace bagua {
namespace {

template <typename Op, typename T>
void reduce_loop(void* out, const void* a, const void* b, size_t n) {
  T* o = static_cast<T*>(out);
  const T* x = static_cast<const T*>(a);
  const T* y = static_cast<const T*>(b);
  for (size_t i = 0; i < n; ++i) o[i] = reduce_element<Op, T>(x[i], y[i]);
}

template <typename T>
ReduceFn pick_op(ReduceOp op) {
  switch (op) {
    case ReduceOp::kSum:
    case ReduceOp::kAvg: return &reduce_loop<SumOp, T>;
    case ReduceOp::kProd: return &reduce_loop<ProdOp, T>;
    case ReduceOp::kMin: return &reduce_loop<MinOp, T>;
    case ReduceOp::kMax: return &reduce_loop<MaxOp, T>;
    case ReduceOp::kBor:
    case ReduceOp::kBand:
    case ReduceOp::kBxor:
      if constexpr (std::is_integral_v<T>) {
        if (op == ReduceOp::kBor) return &reduce_loop<BorOp, T>;
        if (op == ReduceOp::kBand) return &reduce_loop<BandOp, T>;
        return &reduce_loop<BxorOp, T>;
      } else {
        throw InvalidArgument(std::string(reduce_op_name(op)) + " needs an integer dtype (int32, int64, uint8)");
      }
  }
  throw InvalidArgument("unknown reduce op " + std::to_string(static_cast<int>(op)));
}

template <typename T>
void average_loop(void* buf, size_t n, int divisor) {
  T* p = static_cast<T*>(buf);
  for (size_t i = 0; i < n; ++i) p[i] = average_element<T>(p[i], divisor);
}

}  // namespace

ReduceFn cpu_reduce_fn(DType dtype, ReduceOp op) {
  switch (dtype) {
    case DType::kFloat32: return pick_op<float>(op);
    case DType::kFloat64: return pick_op<double>(op);
    case DType::kFloat16: return pick_op<Half>(op);
    case DType::kBFloat16: return pick_op<BFloat16>(op);
    case DType::kInt32: return pick_op<int32_t>(op);
    case DType::kInt64: return pick_op<int64_t>(op);
    case DType::kUInt8: return pick_op<uint8_t>(op);
  }
  throw InvalidArgument("unknown dtype " + std::to_string(static_cast<int>(dtype)));
}

void cpu_reduce(void* out, const void* a, const void* b, size_t n, DType dtype, ReduceOp op) {
  cpu_reduce_fn(dtype, op)(out, a, b, n);
}

void cpu_average(void* buf, size_t n, DType dtype, int divisor) {
  if (divisor == 1) return;
  switch (dtype) {
    case DType::kFloat32: return average_loop<float>(buf, n, divisor);
    case DType::kFloat64: return average_loop<double>(buf, n, divisor);
    case DType::kFloat16: return average_loop<Half>(buf, n, divisor);
    case DType::kBFloat16: return average_loop<BFloat16>(buf, n, divisor);
    case DType::kInt32: return average_loop<int32_t>(buf, n, divisor);
    case DType::kInt64: return average_loop<int64_t>(buf, n, divisor);
    case DType::kUInt8: return average_loop<uint8_t>(buf, n, divisor);
  }
  throw InvalidArgument("unknown dtype " + std::to_string(static_cast<int>(dtype)));
}

}  // namespace bagua
