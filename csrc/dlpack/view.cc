#include "dlpack/view.h"

#include <string>

#include "dlpack/dtype.h"

namespace bagua {
namespace {

std::string shape_str(const std::vector<int64_t>& s) {
  std::string out = "(";
  for (size_t i = 0; i < s.size(); ++i) out += (i ? ", " : "") + std::to_string(s[i]);
  return out + (s.size() == 1 ? ",)" : ")");
}

}  // namespace

std::unique_ptr<DLPackView> DLPackView::adopt(DLManagedTensor* t, std::optional<DType> as) {
  if (t == nullptr) throw InvalidArgument("DLPack capsule holds a null tensor");
  std::unique_ptr<DLPackView> v(new DLPackView());
  v->legacy_ = t;
  v->init(t->dl_tensor, as);
  return v;
}

std::unique_ptr<DLPackView> DLPackView::adopt(DLManagedTensorVersioned* t, std::optional<DType> as) {
  if (t == nullptr) throw InvalidArgument("DLPack capsule holds a null tensor");
  std::unique_ptr<DLPackView> v(new DLPackView());
  v->versioned_ = t;
  if (t->version.major != DLPACK_MAJOR_VERSION) {
    throw UnsupportedType("DLPack version " + std::to_string(t->version.major) + "." +
                          std::to_string(t->version.minor) + " is not supported (need 1.x)");
  }
  v->read_only_ = (t->flags & DLPACK_FLAG_BITMASK_READ_ONLY) != 0;
  v->init(t->dl_tensor, as);
  return v;
}

DLPackView::~DLPackView() {
  if (legacy_ && legacy_->deleter) legacy_->deleter(legacy_);
  if (versioned_ && versioned_->deleter) versioned_->deleter(versioned_);
}

void DLPackView::init(const DLTensor& t, std::optional<DType> as) {
  switch (t.device.device_type) {
    case kDLCPU:
    case kDLCUDAHost:  // pinned host memory is host memory
      device_type_ = DeviceType::kCPU;
      break;
    case kDLCUDA:
    case kDLCUDAManaged: device_type_ = DeviceType::kCUDA; break;
    default:
      throw UnsupportedType("unsupported DLPack device type " + std::to_string(static_cast<int>(t.device.device_type)) +
                            ": Bagua communicates CPU and CUDA arrays");
  }
  device_index_ = t.device.device_id;
  if (as) {
    if (t.dtype.lanes != 1 || t.dtype.bits != 8 * dtype_size(*as)) {
      throw UnsupportedType("cannot read " + dl_dtype_name(t.dtype) + " data as " + dtype_name(*as));
    }
    dtype_ = *as;
  } else {
    dtype_ = from_dl_dtype(t.dtype);
  }
  if (t.ndim < 0 || (t.ndim > 0 && t.shape == nullptr)) {
    throw InvalidArgument("malformed DLPack tensor: ndim " + std::to_string(t.ndim));
  }
  shape_.assign(t.shape, t.shape + t.ndim);
  numel_ = 1;
  for (int64_t d : shape_) {
    if (d < 0) throw InvalidArgument("malformed DLPack tensor: shape " + shape_str(shape_));
    numel_ *= static_cast<size_t>(d);
  }
  // Compact row-major, ignoring the strides of size-1 dimensions (torch and
  // numpy report arbitrary strides there); empty arrays have no layout.
  if (t.strides != nullptr && numel_ > 0) {
    int64_t expected = 1;
    for (int i = t.ndim - 1; i >= 0; --i) {
      if (shape_[i] != 1 && t.strides[i] != expected) {
        std::vector<int64_t> strides(t.strides, t.strides + t.ndim);
        throw InvalidArgument("array of shape " + shape_str(shape_) + " with strides " + shape_str(strides) +
                              " is not C-contiguous; pass a contiguous copy "
                              "(numpy.ascontiguousarray, tensor.contiguous())");
      }
      expected *= shape_[i];
    }
  }
  if (t.data == nullptr && numel_ > 0) throw InvalidArgument("DLPack tensor has null data");
  data_ = static_cast<char*>(t.data) + t.byte_offset;
}

}  // namespace bagua
