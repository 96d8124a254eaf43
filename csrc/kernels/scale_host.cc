// CPU loops over the element functions of kernels/scale.h.
#include <string>

#include "common/error.h"
#include "kernels/scale.h"

namespace bagua {
namespace {

void check_args(void* data, size_t count, DType dtype) {
  if (!is_valid_dtype(static_cast<int>(dtype))) {
    throw InvalidArgument("unknown dtype code " + std::to_string(static_cast<int>(dtype)));
  }
  if (count > 0 && data == nullptr) throw InvalidArgument("null buffer with a non-zero count");
}

}  // namespace

void scale_host(void* data, size_t count, DType dtype, double factor) {
  check_args(data, count, dtype);
  visit_dtype(dtype, [&](auto tag) {
    using T = decltype(tag);
    using M = ScaleMath<T>;
    const auto f = M::factor(factor);
    T* p = static_cast<T*>(data);
    for (size_t i = 0; i < count; ++i) p[i] = M::scale(p[i], f);
  });
}

void divide_host(void* data, size_t count, DType dtype, double divisor) {
  check_args(data, count, dtype);
  if (is_integer_dtype(dtype) && !integer_divisor_ok(divisor)) {
    throw InvalidArgument("integer division needs a non-zero whole divisor, got " + std::to_string(divisor));
  }
  visit_dtype(dtype, [&](auto tag) {
    using T = decltype(tag);
    using M = ScaleMath<T>;
    const auto d = M::divisor(divisor);
    T* p = static_cast<T*>(data);
    for (size_t i = 0; i < count; ++i) p[i] = M::divide(p[i], d);
  });
}

}  // namespace bagua
