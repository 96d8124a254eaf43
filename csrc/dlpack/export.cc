#include "dlpack/export.h"

#include "dlpack/dtype.h"

namespace bagua {
namespace {

// One allocation holds the managed tensor, its shape and the owner reference.
template <typename Managed>
struct ExportContext {
  std::shared_ptr<void> owner;
  std::vector<int64_t> shape;
  Managed managed{};

  static void deleter(Managed* self) { delete static_cast<ExportContext*>(self->manager_ctx); }
};

template <typename Managed>
Managed* make_export(ExportSpec spec) {
  auto* ctx = new ExportContext<Managed>();
  ctx->owner = std::move(spec.owner);
  ctx->shape = std::move(spec.shape);
  ctx->shape.reserve(1);  // a valid shape pointer even for 0-d arrays
  DLTensor& t = ctx->managed.dl_tensor;
  t.data = spec.data;
  t.device = spec.device;
  t.ndim = static_cast<int32_t>(ctx->shape.size());
  t.dtype = to_dl_dtype(spec.dtype);
  t.shape = ctx->shape.data();
  t.strides = nullptr;  // compact row-major
  t.byte_offset = 0;
  ctx->managed.manager_ctx = ctx;
  ctx->managed.deleter = &ExportContext<Managed>::deleter;
  return &ctx->managed;
}

}  // namespace

DLManagedTensorVersioned* export_versioned(ExportSpec spec) {
  uint64_t flags =
      (spec.read_only ? DLPACK_FLAG_BITMASK_READ_ONLY : 0) | (spec.is_copied ? DLPACK_FLAG_BITMASK_IS_COPIED : 0);
  DLManagedTensorVersioned* m = make_export<DLManagedTensorVersioned>(std::move(spec));
  m->version = {DLPACK_MAJOR_VERSION, DLPACK_MINOR_VERSION};
  m->flags = flags;
  return m;
}

DLManagedTensor* export_legacy(ExportSpec spec) { return make_export<DLManagedTensor>(std::move(spec)); }

}  // namespace bagua
