#include "bucket/host_memory.h"

#include <cstdlib>
#include <cstring>
#include <string>

#include "common/error.h"

namespace bagua {

std::shared_ptr<void> allocate_host_memory(size_t nbytes) {
  size_t rounded = (nbytes + kBucketAlignmentBytes - 1) / kBucketAlignmentBytes * kBucketAlignmentBytes;
  if (rounded == 0) rounded = kBucketAlignmentBytes;
  void* p = std::aligned_alloc(kBucketAlignmentBytes, rounded);
  if (p == nullptr) throw Error("cannot allocate " + std::to_string(nbytes) + " bytes of host memory");
  std::memset(p, 0, rounded);
  return std::shared_ptr<void>(p, [](void* q) { std::free(q); });
}

}  // namespace bagua
