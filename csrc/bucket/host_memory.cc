#include "bucket/host_memory.h"

#include "buffer/buffer.h"

namespace bagua {

static_assert(kBucketAlignmentBytes == kHostAlignment, "buckets use the buffers' host alignment");

std::shared_ptr<void> allocate_host_memory(size_t nbytes) {
  std::shared_ptr<Storage> storage = Storage::allocate(nbytes, DeviceType::kCPU, 0, /*zero=*/true);
  void* data = storage->data();
  return std::shared_ptr<void>(std::move(storage), data);  // aliases the Storage's lifetime
}

}  // namespace bagua
