#include "kernels/half_wire.h"

namespace bagua {
namespace half_wire {

void check_dtypes(DType dtype, DType wire) {
  if (wire != DType::kFloat16 && wire != DType::kBFloat16)
    throw InvalidArgument(std::string("a 16-bit wire is float16 or bfloat16, got ") + dtype_name(wire));
  if (dtype != DType::kFloat32 && dtype != DType::kFloat64 && dtype != DType::kFloat16 && dtype != DType::kBFloat16)
    throw InvalidArgument(std::string("a 16-bit wire carries float32, float64, float16 or bfloat16 data, got ") +
                          dtype_name(dtype));
}

void encode_cpu(const void* src, size_t count, DType dtype, DType wire, void* dst) {
  dispatch(dtype, wire, [&](auto t, auto w) {
    using T = decltype(t);
    using W = decltype(w);
    const T* x = static_cast<const T*>(src);
    W* out = static_cast<W*>(dst);
    for (size_t i = 0; i < count; ++i) out[i] = encode<W>(x[i]);
  });
}

void decode_cpu(const void* src, size_t count, DType wire, DType dtype, void* dst) {
  dispatch(dtype, wire, [&](auto t, auto w) {
    using T = decltype(t);
    using W = decltype(w);
    const W* x = static_cast<const W*>(src);
    T* out = static_cast<T*>(dst);
    for (size_t i = 0; i < count; ++i) out[i] = decode<T>(x[i]);
  });
}

void reduce_cpu(const void* src, size_t chunk_len, size_t n_records, DType wire, DType dtype, bool average, void* dst) {
  if (n_records == 0) throw InvalidArgument("a 16-bit reduction needs at least one record");
  dispatch(dtype, wire, [&](auto t, auto w) {
    using T = decltype(t);
    using W = decltype(w);
    const W* records = static_cast<const W*>(src);
    T* out = static_cast<T*>(dst);
    const float divisor = average ? static_cast<float>(n_records) : 1.0f;
    constexpr size_t kTile = 2048;  // float32 sums of one tile stay in L1
    float acc[kTile];
    for (size_t t0 = 0; t0 < chunk_len; t0 += kTile) {
      const size_t tl = chunk_len - t0 < kTile ? chunk_len - t0 : kTile;
      for (size_t i = 0; i < tl; ++i) acc[i] = load_f32(records[t0 + i]);
      for (size_t r = 1; r < n_records; ++r) {
        const W* rec = records + r * chunk_len + t0;
        for (size_t i = 0; i < tl; ++i) acc[i] += load_f32(rec[i]);
      }
      for (size_t i = 0; i < tl; ++i) out[t0 + i] = store_f32<T>(acc[i] / divisor);
    }
  });
}

}  // namespace half_wire
}  // namespace bagua
