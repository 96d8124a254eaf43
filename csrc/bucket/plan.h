// The default bucket plan: which tensors share a bucket, and the buckets' order.
//
// Input: tensor declarations in registration order (frontends pass reverse
// parameter order, the order gradients become ready in backward). Each dtype
// fills its own open bucket in that order; a bucket is closed as soon as it
// holds >= bucket_bytes, and a tensor that would push a non-empty bucket past
// bucket_bytes starts a new one (so a bucket exceeds the size only when it
// holds a single tensor larger than it). Buckets never mix dtypes, and every
// tensor lands in exactly one bucket (int64 included).
//
// Order: buckets are ordered by the registration position of their LAST
// tensor, i.e. by the moment they can become fully ready. With one dtype this
// is plain greedy filling in registration order.
#pragma once

#include <cstddef>
#include <string>
#include <vector>

#include "common/dtype.h"

namespace bagua {

struct TensorDecl {
  std::string name;
  size_t numel;
  DType dtype;
};

// Each inner vector lists indices into `tensors`, in registration order.
// Throws InvalidArgument on duplicate names or bucket_bytes == 0.
std::vector<std::vector<size_t>> plan_buckets(const std::vector<TensorDecl>& tensors, size_t bucket_bytes);

}  // namespace bagua
