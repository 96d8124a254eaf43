// A bucket: one flat, core-owned buffer of ONE dtype holding named slots, in
// host memory or on a Device (device/device.h: CUDA, or the host
// implementation the suite runs the device path on).
//
// Frontends view each slot zero-copy (parameters or gradients become views of
// the bucket), so the engine communicates the whole bucket with one call per
// algorithm step. The buffer is 64-byte aligned and zero-initialised. When an
// algorithm needs the element count to be a multiple of `alignment` (ByteGrad:
// the group size), a zero padding slot is appended; padding is always ready.
//
// A Bucket is layout and memory only. Readiness and the op chain live in the
// Engine (sched/engine.h), which guards them with its lock.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "common/dtype.h"
#include "device/device.h"

namespace bagua {

struct SlotSpec {
  std::string name;
  std::vector<int64_t> shape;  // numel = product (an empty shape is a scalar)
};

struct Slot {
  std::string name;
  std::vector<int64_t> shape;
  size_t offset;  // in elements from the start of the bucket
  size_t numel;
  bool is_padding;
};

class Bucket {
 public:
  // Throws InvalidArgument on an empty slot list, duplicate or empty names,
  // negative dimensions or alignment 0. Without a device the memory is plain
  // host memory; with one it comes from device->allocate().
  Bucket(std::string name, DType dtype, std::vector<SlotSpec> slots, size_t alignment = 1, DevicePtr device = nullptr);

  const std::string& name() const { return name_; }
  DType dtype() const { return dtype_; }
  size_t alignment() const { return alignment_; }
  size_t numel() const { return numel_; }                  // padding included
  size_t payload_numel() const { return payload_numel_; }  // padding excluded
  size_t nbytes() const { return numel_ * dtype_size(dtype_); }
  void* data() const { return memory_.get(); }
  // Null for plain host memory.
  const DevicePtr& device() const { return device_; }
  DeviceType device_type() const { return device_ ? device_->type() : DeviceType::kCPU; }
  int device_index() const { return device_ ? device_->index() : 0; }
  // Keeps the memory alive (DLPack exports hold it).
  const std::shared_ptr<void>& memory() const { return memory_; }

  const std::vector<Slot>& slots() const { return slots_; }
  size_t num_slots() const { return slots_.size(); }
  // Index of the slot called `name`, or -1.
  int64_t find_slot(const std::string& name) const;
  const Slot& slot(size_t index) const;  // throws InvalidArgument when out of range
  void* slot_data(size_t index) const;

  // "bucket 'b0' (float32, tensors: 'a', 'b' and 4 more)" for error messages;
  // `position` (e.g. "#1 of 3") is shown first when given.
  std::string describe(const std::string& position = "", size_t max_names = 8) const;
  // Names of the given slots, at most max_names of them, then "and N more".
  std::string list_slots(const std::vector<size_t>& indices, size_t max_names = 8) const;

 private:
  std::string name_;
  DType dtype_;
  size_t alignment_;
  std::vector<Slot> slots_;
  size_t numel_ = 0;
  size_t payload_numel_ = 0;
  DevicePtr device_;
  std::shared_ptr<void> memory_;
};

using BucketPtr = std::shared_ptr<Bucket>;

// Name of the padding slot of bucket `bucket_name` (as in the original Bagua).
std::string padding_slot_name(const std::string& bucket_name);

}  // namespace bagua
