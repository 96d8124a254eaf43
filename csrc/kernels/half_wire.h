// HalfGrad's wire format (ops/halfgrad.h): floating data of any dtype carried
// as 16-bit floats (the wire dtype: float16 or bfloat16, kernels/half.h) and
// summed in float32. Per element, with float32 arithmetic (float64 data is
// rounded to float32 first, as MinMaxUInt8 does):
//   encode:  w = round16(x)                         (round to nearest even)
//   reduce:  y = T((w_0 + w_1 + ... + w_{n-1}) / n)  (record 0 first; "/ n" only when averaging)
//   decode:  y = T(w)
// The element functions below are BAGUA_HD: the host loops
// (kernels/half_wire_cpu.cc) and the CUDA kernels (kernels/cuda_kernels.cu)
// run the same code and give the same bits.
#pragma once

#include <cstddef>
#include <string>

#include "common/dtype.h"
#include "common/error.h"
#include "kernels/half.h"
#include "kernels/hd.h"

namespace bagua {
namespace half_wire {

template <typename W, typename T>
BAGUA_HD W encode(T x) {
  return store_f32<W>(load_f32(x));
}

template <typename T, typename W>
BAGUA_HD T decode(W w) {
  return store_f32<T>(load_f32(w));
}

// Throws InvalidArgument unless wire is float16 or bfloat16 and dtype is floating.
void check_dtypes(DType dtype, DType wire);

// Calls f(T{}, W{}) with the C++ types of a floating data dtype and a 16-bit wire dtype.
template <typename F>
void dispatch(DType dtype, DType wire, F&& f) {
  check_dtypes(dtype, wire);
  auto with_wire = [&](auto t) {
    if (wire == DType::kFloat16)
      f(t, Half{});
    else
      f(t, BFloat16{});
  };
  switch (dtype) {
    case DType::kFloat32: with_wire(float{}); return;
    case DType::kFloat64: with_wire(double{}); return;
    case DType::kFloat16: with_wire(Half{}); return;
    default: with_wire(BFloat16{}); return;
  }
}

// dst (count elements of wire) <- encode(src (count elements of dtype)).
void encode_cpu(const void* src, size_t count, DType dtype, DType wire, void* dst);
// dst (count elements of dtype) <- decode(src (count elements of wire)).
void decode_cpu(const void* src, size_t count, DType wire, DType dtype, void* dst);
// src: n_records records of chunk_len wire elements, back to back; dst:
// chunk_len elements of dtype, their float32 sum (divided by n_records when
// average). n_records >= 1.
void reduce_cpu(const void* src, size_t chunk_len, size_t n_records, DType wire, DType dtype, bool average, void* dst);

}  // namespace half_wire
}  // namespace bagua
