// Element math of the decentralized ops, written once for CPU loops and CUDA
// kernels. float16/bfloat16 compute in float32 and round once on store.
#pragma once

#include <cstddef>

#include "common/dtype.h"
#include "kernels/half.h"
#include "kernels/hd.h"

namespace bagua {

template <typename T>
struct AverageMath {
  static BAGUA_HD T average(T a, T b) { return (a + b) / T(2); }
};
template <>
struct AverageMath<Half> {
  static BAGUA_HD Half average(Half a, Half b) { return to_half((to_float(a) + to_float(b)) * 0.5f); }
};
template <>
struct AverageMath<BFloat16> {
  static BAGUA_HD BFloat16 average(BFloat16 a, BFloat16 b) {
    return to_bfloat16((to_float(a) + to_float(b)) * 0.5f);
  }
};

// acc[i] = (acc[i] + other[i]) / 2 on host memory, for floating dtypes.
// Throws InvalidArgument for other dtypes.
void average_into_cpu(void* acc, const void* other, size_t count, DType dtype);

// True for the dtypes average_into_cpu accepts.
bool is_floating(DType dtype);

}  // namespace bagua
