// Core-owned memory, exported to frameworks as DLPack views.
//
// Host memory is 64-byte aligned: JAX copies anything less instead of viewing
// it. Device memory comes from cudaMalloc (builds with CUDA only). A Buffer is
// a typed window (shape, dtype) on a shared Storage, which lives as long as
// any Buffer or DLPack export refers to it.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

#include "common/dtype.h"

namespace bagua {

constexpr size_t kHostAlignment = 64;

class Storage {
 public:
  // Throws bagua::Error when the memory cannot be allocated.
  static std::shared_ptr<Storage> allocate(size_t nbytes, DeviceType device, int device_index, bool zero);
  ~Storage();
  Storage(const Storage&) = delete;
  Storage& operator=(const Storage&) = delete;

  void* data() const { return data_; }
  size_t nbytes() const { return nbytes_; }
  DeviceType device_type() const { return device_type_; }
  int device_index() const { return device_index_; }

 private:
  Storage() = default;
  void* data_ = nullptr;
  size_t nbytes_ = 0;
  DeviceType device_type_ = DeviceType::kCPU;
  int device_index_ = 0;
};

class Buffer {
 public:
  Buffer(std::vector<int64_t> shape, DType dtype, DeviceType device = DeviceType::kCPU, int device_index = 0,
         bool zero = false);

  // The same bytes read as another dtype: same shape when element sizes match,
  // else 1-D. Throws InvalidArgument when the byte count does not divide.
  Buffer view(DType dtype) const;

  void* data() const { return storage_->data(); }
  size_t numel() const { return numel_; }
  size_t nbytes() const { return numel_ * dtype_size(dtype_); }
  const std::vector<int64_t>& shape() const { return shape_; }
  DType dtype() const { return dtype_; }
  DeviceType device_type() const { return storage_->device_type(); }
  int device_index() const { return storage_->device_index(); }
  const std::shared_ptr<Storage>& storage() const { return storage_; }

 private:
  Buffer(std::shared_ptr<Storage> storage, std::vector<int64_t> shape, DType dtype);
  std::shared_ptr<Storage> storage_;
  std::vector<int64_t> shape_;
  DType dtype_;
  size_t numel_;
};

// memcpy on host or device memory (device-to-device within one device).
void copy_bytes(void* dst, const void* src, size_t nbytes, DeviceType device);

}  // namespace bagua
