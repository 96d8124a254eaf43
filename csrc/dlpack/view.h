// An array borrowed zero-copy from a DLPack producer (numpy, torch, JAX, CuPy...).
// The view owns the producer's managed tensor and calls its deleter when it is
// destroyed, so the producer's memory stays alive exactly as long as the view.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <vector>

#include "common/dtype.h"
#include "dlpack/dlpack.h"

namespace bagua {

class DLPackView {
 public:
  // Take ownership of a managed tensor and validate it: a supported dtype
  // (UnsupportedType otherwise), a CPU or CUDA device (UnsupportedType) and a
  // C-contiguous layout (InvalidArgument). On failure the deleter still runs.
  // `as` reads the elements as another dtype of the same size (e.g. the uint16
  // export of bfloat16 data from a producer that cannot name bfloat16).
  static std::unique_ptr<DLPackView> adopt(DLManagedTensor* t, std::optional<DType> as = {});
  static std::unique_ptr<DLPackView> adopt(DLManagedTensorVersioned* t, std::optional<DType> as = {});

  ~DLPackView();
  DLPackView(const DLPackView&) = delete;
  DLPackView& operator=(const DLPackView&) = delete;

  void* data() const { return data_; }  // includes byte_offset
  size_t numel() const { return numel_; }
  size_t nbytes() const { return numel_ * dtype_size(dtype_); }
  const std::vector<int64_t>& shape() const { return shape_; }
  DType dtype() const { return dtype_; }
  DeviceType device_type() const { return device_type_; }
  int device_index() const { return device_index_; }
  bool read_only() const { return read_only_; }

  void mark_read_only() { read_only_ = true; }

 private:
  DLPackView() = default;
  void init(const DLTensor& t, std::optional<DType> as);

  DLManagedTensor* legacy_ = nullptr;
  DLManagedTensorVersioned* versioned_ = nullptr;
  void* data_ = nullptr;
  size_t numel_ = 0;
  std::vector<int64_t> shape_;
  DType dtype_ = DType::kFloat32;
  DeviceType device_type_ = DeviceType::kCPU;
  int device_index_ = 0;
  bool read_only_ = false;
};

}  // namespace bagua
