#include "ops/elementwise.h"

#include <string>

#include "common/error.h"

namespace bagua {
namespace {

template <typename T>
void average_loop(T* __restrict acc, const T* __restrict other, size_t count) {
  for (size_t i = 0; i < count; ++i) acc[i] = AverageMath<T>::average(acc[i], other[i]);
}

}  // namespace

bool is_floating(DType dtype) {
  return dtype == DType::kFloat32 || dtype == DType::kFloat64 || dtype == DType::kFloat16 ||
         dtype == DType::kBFloat16;
}

void average_into_cpu(void* acc, const void* other, size_t count, DType dtype) {
  switch (dtype) {
    case DType::kFloat32:
      return average_loop(static_cast<float*>(acc), static_cast<const float*>(other), count);
    case DType::kFloat64:
      return average_loop(static_cast<double*>(acc), static_cast<const double*>(other), count);
    case DType::kFloat16:
      return average_loop(static_cast<Half*>(acc), static_cast<const Half*>(other), count);
    case DType::kBFloat16:
      return average_loop(static_cast<BFloat16*>(acc), static_cast<const BFloat16*>(other), count);
    default:
      throw InvalidArgument(std::string("averaging needs a floating dtype, got ") + dtype_name(dtype));
  }
}

}  // namespace bagua
