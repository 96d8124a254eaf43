#include "bucket/bucket.h"

#include <unordered_set>

#include "bucket/host_memory.h"
#include "common/error.h"

namespace bagua {

std::string padding_slot_name(const std::string& bucket_name) { return "bagua_padding_tensor_bucket_" + bucket_name; }

Bucket::Bucket(std::string name, DType dtype, std::vector<SlotSpec> specs, size_t alignment, DevicePtr device)
    : name_(std::move(name)), dtype_(dtype), alignment_(alignment), device_(std::move(device)) {
  if (!is_valid_dtype(static_cast<int>(dtype)))
    throw InvalidArgument("bucket '" + name_ + "': unknown dtype " + std::to_string(static_cast<int>(dtype)));
  if (alignment == 0) throw InvalidArgument("bucket '" + name_ + "': alignment must be >= 1");
  if (specs.empty()) throw InvalidArgument("bucket '" + name_ + "' has no tensors");
  std::unordered_set<std::string> seen;
  size_t offset = 0;
  for (auto& s : specs) {
    if (s.name.empty()) throw InvalidArgument("bucket '" + name_ + "': a tensor has an empty name");
    if (!seen.insert(s.name).second)
      throw InvalidArgument("bucket '" + name_ + "': tensor '" + s.name + "' appears twice");
    size_t n = 1;
    for (int64_t d : s.shape) {
      if (d < 0)
        throw InvalidArgument("bucket '" + name_ + "': tensor '" + s.name + "' has negative dimension " +
                              std::to_string(d));
      n *= static_cast<size_t>(d);
    }
    slots_.push_back(Slot{std::move(s.name), std::move(s.shape), offset, n, false});
    offset += n;
  }
  payload_numel_ = offset;
  const size_t rem = offset % alignment;
  if (rem != 0) {
    const size_t pad = alignment - rem;
    std::string pad_name = padding_slot_name(name_);
    if (seen.count(pad_name))
      throw InvalidArgument("bucket '" + name_ + "': tensor name '" + pad_name + "' is reserved");
    slots_.push_back(Slot{std::move(pad_name), {static_cast<int64_t>(pad)}, offset, pad, true});
    offset += pad;
  }
  numel_ = offset;
  memory_ = device_ ? device_->allocate(nbytes()) : allocate_host_memory(nbytes());
}

int64_t Bucket::find_slot(const std::string& name) const {
  for (size_t i = 0; i < slots_.size(); ++i)
    if (slots_[i].name == name) return static_cast<int64_t>(i);
  return -1;
}

const Slot& Bucket::slot(size_t index) const {
  if (index >= slots_.size())
    throw InvalidArgument("bucket '" + name_ + "' has " + std::to_string(slots_.size()) + " slots, no slot " +
                          std::to_string(index));
  return slots_[index];
}

void* Bucket::slot_data(size_t index) const {
  return static_cast<char*>(data()) + slot(index).offset * dtype_size(dtype_);
}

std::string Bucket::list_slots(const std::vector<size_t>& indices, size_t max_names) const {
  std::string out;
  size_t shown = 0;
  for (size_t i : indices) {
    if (shown == max_names) break;
    if (shown) out += ", ";
    out += "'" + slots_.at(i).name + "'";
    ++shown;
  }
  if (indices.size() > shown) out += " and " + std::to_string(indices.size() - shown) + " more";
  return out;
}

std::string Bucket::describe(const std::string& position, size_t max_names) const {
  std::vector<size_t> real;
  for (size_t i = 0; i < slots_.size(); ++i)
    if (!slots_[i].is_padding) real.push_back(i);
  return "bucket '" + name_ + "' (" + (position.empty() ? "" : position + ", ") + dtype_name(dtype_) +
         ", tensors: " + list_slots(real, max_names) + ")";
}

}  // namespace bagua
