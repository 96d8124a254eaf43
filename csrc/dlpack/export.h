// Exports memory as DLPack managed tensors. The tensor keeps `owner` alive
// until the consumer calls its deleter, so exported memory outlives every view.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "common/dtype.h"
#include "dlpack/dlpack.h"

namespace bagua {

struct ExportSpec {
  std::shared_ptr<void> owner;  // released by the deleter
  void* data;
  std::vector<int64_t> shape;
  DType dtype;
  DLDevice device;
  bool read_only = false;
  bool is_copied = false;  // versioned exports flag copies made for the consumer
};

DLManagedTensorVersioned* export_versioned(ExportSpec spec);
DLManagedTensor* export_legacy(ExportSpec spec);

}  // namespace bagua
