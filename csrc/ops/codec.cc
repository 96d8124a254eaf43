#include "ops/codec.h"

#include <cmath>
#include <cstdio>

#include "common/error.h"
#include "kernels/minmax_uint8.h"
#include "ops/kernels.h"

namespace bagua {
namespace {

struct Entry {
  const char* name;
  bool minmax8;
  lowbit::Format format;
};

const Entry kEntries[] = {
    {"minmax_uint8", true, lowbit::Format::kMinmax4},  {"minmax_uint4", false, lowbit::Format::kMinmax4},
    {"minmax_uint2", false, lowbit::Format::kMinmax2}, {"fp4_e2m1", false, lowbit::Format::kFp4E2M1},
    {"topk_uint4", false, lowbit::Format::kTopk4},     {"topk_uint2", false, lowbit::Format::kTopk2},
};

}  // namespace

const std::vector<std::string>& Codec::names() {
  static const std::vector<std::string> all = [] {
    std::vector<std::string> v;
    for (const Entry& e : kEntries) v.push_back(e.name);
    return v;
  }();
  return all;
}

Codec Codec::make(const std::string& who, const std::string& name, double topk_density) {
  for (const Entry& e : kEntries) {
    if (name != e.name) continue;
    Codec c;
    c.name_ = name;
    c.dense_minmax8_ = e.minmax8;
    c.spec_.format = e.format;
    if (!e.minmax8 && lowbit::is_topk(c.spec_)) {
      if (!(topk_density > 0.0 && topk_density <= 1.0)) {
        char buf[64];
        std::snprintf(buf, sizeof buf, "%.17g", topk_density);
        throw InvalidArgument(who + ": topk_density must be in (0, 1], got " + buf);
      }
      const double k = std::ceil(topk_density * static_cast<double>(lowbit::kTopkBlock));
      c.spec_.k = static_cast<uint32_t>(k < 1.0 ? 1.0 : k);
    }
    return c;
  }
  std::string known;
  for (const std::string& n : names()) known += (known.empty() ? "'" : ", '") + n + "'";
  throw InvalidArgument(who + ": unknown compression '" + name + "' (known: " + known + ")");
}

size_t Codec::record_bytes(size_t chunk_len) const {
  return dense_minmax8_ ? minmax_uint8::record_bytes(chunk_len) : lowbit::record_bytes(spec_, chunk_len);
}

void Codec::compress(const ExecContext& ctx, const void* src, size_t n, DType dtype, size_t n_chunks, void* dst,
                     int64_t target_chunk) const {
  if (dense_minmax8_) return step_kernels::compress(ctx, src, n, dtype, n_chunks, dst, target_chunk);
  step_kernels::lowbit_compress(ctx, spec_, src, n, dtype, n_chunks, dst, target_chunk);
}

void Codec::decompress(const ExecContext& ctx, const void* src, size_t n, DType dtype, size_t n_chunks, void* dst,
                       int64_t target_chunk) const {
  if (dense_minmax8_) return step_kernels::decompress(ctx, src, n, dtype, n_chunks, dst, target_chunk);
  step_kernels::lowbit_decompress(ctx, spec_, src, n, dtype, n_chunks, dst, target_chunk);
}

void Codec::residual(const ExecContext& ctx, const void* src, const void* x, size_t n, DType dtype, size_t n_chunks,
                     void* e, int64_t target_chunk) const {
  if (dense_minmax8_) return step_kernels::residual(ctx, src, x, n, dtype, n_chunks, e, target_chunk);
  step_kernels::lowbit_residual(ctx, spec_, src, x, n, dtype, n_chunks, e, target_chunk);
}

void Codec::reduce_chunks(const ExecContext& ctx, const void* src, size_t chunk_len, size_t n_records, DType dtype,
                          bool average, void* dst) const {
  if (dense_minmax8_) return step_kernels::reduce_chunks(ctx, src, chunk_len, n_records, dtype, average, dst);
  step_kernels::lowbit_reduce_chunks(ctx, spec_, src, chunk_len, n_records, dtype, average, dst);
}

}  // namespace bagua
