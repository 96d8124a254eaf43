// Launchers of Bagua's CUDA kernels (kernels/cuda_kernels.cu). Plain C++: any
// translation unit of a CUDA build may call them. Each launch is asynchronous
// on `stream`; launch failures throw bagua::Error, bad arguments
// bagua::InvalidArgument (a dtype the host loop rejects, a null buffer with a
// non-zero count). Empty buffers launch nothing. Pointers are device memory.
//
// The kernels run the same BAGUA_HD element functions as the host loops
// (kernels/scale.h, ops/elementwise.h), so every non-NaN result is bitwise the
// host's: neither side contracts a * b + c into an FMA (CMakeLists.txt builds
// CUDA with -fmad=false and C++ with -ffp-contract=off), both divide
// IEEE-rounded and keep subnormals (no --use_fast_math / -ftz=true). A NaN
// result is NaN on both, but its sign and payload may differ (the GPU returns
// the canonical NaN where x86 propagates an input's NaN).
#pragma once

#include <cstddef>

#include <cuda_runtime_api.h>

#include "common/dtype.h"

namespace bagua {
namespace cuda {

// data[i] *= factor (see kernels/scale.h for the rounding of each dtype).
void launch_scale(void* data, size_t count, DType dtype, double factor, cudaStream_t stream);
// data[i] /= divisor; integer dtypes need a non-zero whole divisor.
void launch_divide(void* data, size_t count, DType dtype, double divisor, cudaStream_t stream);

// The decentralized steps' element math (ops/elementwise.h), for float32,
// float64, float16 and bfloat16 (16-bit types computed in float32):
// acc[i] = AverageMath::average(acc[i], other[i]).
void launch_average_into(void* acc, const void* other, size_t count, DType dtype, cudaStream_t stream);
// t[i] = ReplicaMath::diff(t[i], w[i], l[i], r[i]).
void launch_replica_diff(void* t, const void* w, const void* l, const void* r, size_t count, DType dtype,
                         cudaStream_t stream);
// acc[i] = ReplicaMath::add(acc[i], other[i]).
void launch_add_into(void* acc, const void* other, size_t count, DType dtype, cudaStream_t stream);
// w[i] = AsyncAverageMath::apply(w[i], snapshot[i], avg[i]).
void launch_apply_average(void* w, const void* snapshot, const void* avg, size_t count, DType dtype,
                          cudaStream_t stream);
// m[i] = MomentumMath::update(m[i], g[i], beta, 1 - beta); float32 and float64 only, as on the host.
void launch_momentum_update(void* m, const void* g, size_t count, DType dtype, double beta, cudaStream_t stream);
// d[i] = a[i] - d[i]; then one outer SGD step per element (ops/elementwise.h OuterSgdMath).
void launch_pseudo_gradient(void* d, const void* a, size_t count, DType dtype, cudaStream_t stream);
// w[i] = outer_mix_element(w[i], a[i], alpha).
void launch_outer_mix(void* w, const void* a, size_t count, DType dtype, double alpha, cudaStream_t stream);
void launch_outer_sgd(void* w, void* a, void* m, const void* d, size_t count, DType dtype, double lr, double mu,
                      bool nesterov, bool fresh, cudaStream_t stream);

// HalfGrad's 16-bit wire (kernels/half_wire.h; wire: float16 or bfloat16):
// dst[i] = encode(src[i]), dst[i] = decode(src[i]), and the float32 sum of
// n_records records of chunk_len wire elements (divided by n_records when average).
void launch_wire_encode(const void* src, size_t count, DType dtype, DType wire, void* dst, cudaStream_t stream);
void launch_wire_decode(const void* src, size_t count, DType wire, DType dtype, void* dst, cudaStream_t stream);
void launch_wire_reduce(const void* src, size_t chunk_len, size_t n_records, DType wire, DType dtype, bool average,
                        void* dst, cudaStream_t stream);

}  // namespace cuda
}  // namespace bagua
