// Zeroed, 64-byte aligned host memory for buckets and op scratch buffers
// (a bagua::Storage, see buffer/buffer.h; JAX views host memory zero-copy only
// when it is 64-byte aligned).
#pragma once

#include <cstddef>
#include <memory>

namespace bagua {

constexpr size_t kBucketAlignmentBytes = 64;

// Never returns null: zero bytes still get a valid aligned address.
// Throws bagua::Error when the memory cannot be allocated.
std::shared_ptr<void> allocate_host_memory(size_t nbytes);

}  // namespace bagua
