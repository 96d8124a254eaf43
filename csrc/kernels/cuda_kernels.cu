// CUDA kernels over the element functions shared with the CPU (kernels/*.h,
// ops/elementwise.h).
#include <algorithm>
#include <initializer_list>
#include <string>
#include <type_traits>

#include <cuda_runtime.h>

#include "common/error.h"
#include "kernels/cuda_kernels.h"
#include "kernels/half_wire.h"
#include "kernels/scale.h"
#include "ops/elementwise.h"

namespace bagua {
namespace cuda {
namespace {

constexpr int kThreads = 256;
constexpr size_t kMaxBlocks = 4096;  // grid-stride loops cover the rest

unsigned int blocks_for(size_t count) {
  return static_cast<unsigned int>(std::min((count + kThreads - 1) / kThreads, kMaxBlocks));
}

template <typename T>
__global__ void scale_kernel(T* data, size_t count, typename ScaleMath<T>::Factor factor) {
  const size_t stride = static_cast<size_t>(blockDim.x) * gridDim.x;
  for (size_t i = static_cast<size_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < count; i += stride) {
    data[i] = ScaleMath<T>::scale(data[i], factor);
  }
}

template <typename T>
__global__ void divide_kernel(T* data, size_t count, typename ScaleMath<T>::Divisor divisor) {
  const size_t stride = static_cast<size_t>(blockDim.x) * gridDim.x;
  for (size_t i = static_cast<size_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < count; i += stride) {
    data[i] = ScaleMath<T>::divide(data[i], divisor);
  }
}

// Runs op(i) for every i < count, one grid-stride loop. Op is a small struct
// of pointers with a __device__ operator() (the element functions are BAGUA_HD).
template <typename Op>
__global__ void for_each_kernel(size_t count, Op op) {
  const size_t stride = static_cast<size_t>(blockDim.x) * gridDim.x;
  for (size_t i = static_cast<size_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < count; i += stride) op(i);
}

template <typename T>
struct AverageOp {
  T* acc;
  const T* other;
  __device__ void operator()(size_t i) const { acc[i] = AverageMath<T>::average(acc[i], other[i]); }
};

template <typename T>
struct ReplicaDiffOp {
  T* t;
  const T* w;
  const T* l;
  const T* r;
  __device__ void operator()(size_t i) const { t[i] = ReplicaMath<T>::diff(t[i], w[i], l[i], r[i]); }
};

template <typename T>
struct AddOp {
  T* acc;
  const T* other;
  __device__ void operator()(size_t i) const { acc[i] = ReplicaMath<T>::add(acc[i], other[i]); }
};

template <typename T>
struct ApplyAverageOp {
  T* w;
  const T* snapshot;
  const T* avg;
  __device__ void operator()(size_t i) const { w[i] = AsyncAverageMath<T>::apply(w[i], snapshot[i], avg[i]); }
};

template <typename T>
struct MomentumOp {
  T* m;
  const T* g;
  T beta;
  T one_minus_beta;
  __device__ void operator()(size_t i) const { m[i] = MomentumMath<T>::update(m[i], g[i], beta, one_minus_beta); }
};

template <typename T>
struct PseudoGradientOp {
  T* d;
  const T* a;
  __device__ void operator()(size_t i) const { outer_pseudo_gradient(d[i], a[i]); }
};

template <typename T>
struct OuterSgdOp {
  T* w;
  T* a;
  T* m;
  const T* d;
  typename OuterAcc<T>::type lr;
  typename OuterAcc<T>::type mu;
  bool nesterov;
  bool fresh;
  __device__ void operator()(size_t i) const { outer_sgd_element(w[i], a[i], m[i], d[i], lr, mu, nesterov, fresh); }
};

template <typename T>
struct OuterMixOp {
  T* w;
  const T* a;
  typename OuterAcc<T>::type alpha;
  __device__ void operator()(size_t i) const { outer_mix_element(w[i], a[i], alpha); }
};

template <typename W, typename T>
struct WireEncodeOp {
  const T* src;
  W* dst;
  __device__ void operator()(size_t i) const { dst[i] = half_wire::encode<W>(src[i]); }
};

template <typename T, typename W>
struct WireDecodeOp {
  const W* src;
  T* dst;
  __device__ void operator()(size_t i) const { dst[i] = half_wire::decode<T>(src[i]); }
};

// Same order as the host loop: record 0, then 1, ...; one division at the end.
template <typename T, typename W>
struct WireReduceOp {
  const W* records;
  T* dst;
  size_t chunk_len;
  size_t n_records;
  float divisor;
  __device__ void operator()(size_t i) const {
    float acc = load_f32(records[i]);
    for (size_t r = 1; r < n_records; ++r) acc += load_f32(records[r * chunk_len + i]);
    dst[i] = store_f32<T>(acc / divisor);
  }
};

void check_args(void* data, size_t count, DType dtype) {
  if (!is_valid_dtype(static_cast<int>(dtype))) {
    throw InvalidArgument("unknown dtype code " + std::to_string(static_cast<int>(dtype)));
  }
  if (count > 0 && data == nullptr) throw InvalidArgument("null buffer with a non-zero count");
}

void check_launch(const char* kernel, DType dtype) {
  cudaError_t err = cudaGetLastError();
  if (err != cudaSuccess) {
    throw Error(std::string("launching the ") + kernel + " kernel (" + dtype_name(dtype) +
                ") failed: " + cudaGetErrorName(err) + ": " + cudaGetErrorString(err));
  }
}

void check_buffers(size_t count, std::initializer_list<const void*> buffers) {
  if (count == 0) return;
  for (const void* b : buffers) {
    if (b == nullptr) throw InvalidArgument("null buffer with a non-zero count");
  }
}

template <typename Op>
void launch_for_each(const char* kernel, DType dtype, size_t count, Op op, cudaStream_t stream) {
  for_each_kernel<Op><<<blocks_for(count), kThreads, 0, stream>>>(count, op);
  check_launch(kernel, dtype);
}

}  // namespace

void launch_scale(void* data, size_t count, DType dtype, double factor, cudaStream_t stream) {
  check_args(data, count, dtype);
  if (count == 0) return;
  visit_dtype(dtype, [&](auto tag) {
    using T = decltype(tag);
    scale_kernel<T>
        <<<blocks_for(count), kThreads, 0, stream>>>(static_cast<T*>(data), count, ScaleMath<T>::factor(factor));
  });
  check_launch("scale", dtype);
}

void launch_divide(void* data, size_t count, DType dtype, double divisor, cudaStream_t stream) {
  check_args(data, count, dtype);
  if (is_integer_dtype(dtype) && !integer_divisor_ok(divisor)) {
    throw InvalidArgument("integer division needs a non-zero whole divisor, got " + std::to_string(divisor));
  }
  if (count == 0) return;
  visit_dtype(dtype, [&](auto tag) {
    using T = decltype(tag);
    divide_kernel<T>
        <<<blocks_for(count), kThreads, 0, stream>>>(static_cast<T*>(data), count, ScaleMath<T>::divisor(divisor));
  });
  check_launch("divide", dtype);
}

void launch_average_into(void* acc, const void* other, size_t count, DType dtype, cudaStream_t stream) {
  with_floating(dtype, "averaging", [&](auto* tag) {
    using T = std::remove_pointer_t<decltype(tag)>;
    check_buffers(count, {acc, other});
    if (count == 0) return;
    launch_for_each("average", dtype, count, AverageOp<T>{static_cast<T*>(acc), static_cast<const T*>(other)}, stream);
  });
}

void launch_replica_diff(void* t, const void* w, const void* l, const void* r, size_t count, DType dtype,
                         cudaStream_t stream) {
  with_floating(dtype, "the replica difference", [&](auto* tag) {
    using T = std::remove_pointer_t<decltype(tag)>;
    check_buffers(count, {t, w, l, r});
    if (count == 0) return;
    launch_for_each("replica difference", dtype, count,
                    ReplicaDiffOp<T>{static_cast<T*>(t), static_cast<const T*>(w), static_cast<const T*>(l),
                                     static_cast<const T*>(r)},
                    stream);
  });
}

void launch_add_into(void* acc, const void* other, size_t count, DType dtype, cudaStream_t stream) {
  with_floating(dtype, "adding", [&](auto* tag) {
    using T = std::remove_pointer_t<decltype(tag)>;
    check_buffers(count, {acc, other});
    if (count == 0) return;
    launch_for_each("add", dtype, count, AddOp<T>{static_cast<T*>(acc), static_cast<const T*>(other)}, stream);
  });
}

void launch_apply_average(void* w, const void* snapshot, const void* avg, size_t count, DType dtype,
                          cudaStream_t stream) {
  with_floating(dtype, "applying a model average", [&](auto* tag) {
    using T = std::remove_pointer_t<decltype(tag)>;
    check_buffers(count, {w, snapshot, avg});
    if (count == 0) return;
    launch_for_each("apply average", dtype, count,
                    ApplyAverageOp<T>{static_cast<T*>(w), static_cast<const T*>(snapshot), static_cast<const T*>(avg)},
                    stream);
  });
}

void launch_pseudo_gradient(void* d, const void* a, size_t count, DType dtype, cudaStream_t stream) {
  with_floating(dtype, "the pseudo-gradient", [&](auto* tag) {
    using T = std::remove_pointer_t<decltype(tag)>;
    check_buffers(count, {d, a});
    if (count == 0) return;
    launch_for_each("pseudo-gradient", dtype, count, PseudoGradientOp<T>{static_cast<T*>(d), static_cast<const T*>(a)},
                    stream);
  });
}

void launch_outer_mix(void* w, const void* a, size_t count, DType dtype, double alpha, cudaStream_t stream) {
  with_floating(dtype, "the fragment merge", [&](auto* tag) {
    using T = std::remove_pointer_t<decltype(tag)>;
    using A = typename OuterAcc<T>::type;
    check_buffers(count, {w, a});
    if (count == 0) return;
    launch_for_each("outer mix", dtype, count,
                    OuterMixOp<T>{static_cast<T*>(w), static_cast<const T*>(a), static_cast<A>(alpha)}, stream);
  });
}

void launch_outer_sgd(void* w, void* a, void* m, const void* d, size_t count, DType dtype, double lr, double mu,
                      bool nesterov, bool fresh, cudaStream_t stream) {
  with_floating(dtype, "the outer optimizer step", [&](auto* tag) {
    using T = std::remove_pointer_t<decltype(tag)>;
    using A = typename OuterAcc<T>::type;
    check_buffers(count, {w, a, m, d});
    if (count == 0) return;
    launch_for_each("outer SGD", dtype, count,
                    OuterSgdOp<T>{static_cast<T*>(w), static_cast<T*>(a), static_cast<T*>(m), static_cast<const T*>(d),
                                  static_cast<A>(lr), static_cast<A>(mu), nesterov, fresh},
                    stream);
  });
}

void launch_momentum_update(void* m, const void* g, size_t count, DType dtype, double beta, cudaStream_t stream) {
  with_momentum_dtype(dtype, [&](auto* tag) {
    using T = std::remove_pointer_t<decltype(tag)>;
    check_buffers(count, {m, g});
    if (count == 0) return;
    launch_for_each("momentum update", dtype, count,
                    MomentumOp<T>{static_cast<T*>(m), static_cast<const T*>(g), MomentumMath<T>::beta(beta),
                                  MomentumMath<T>::one_minus_beta(beta)},
                    stream);
  });
}

void launch_wire_encode(const void* src, size_t count, DType dtype, DType wire, void* dst, cudaStream_t stream) {
  half_wire::dispatch(dtype, wire, [&](auto t, auto w) {
    using T = decltype(t);
    using W = decltype(w);
    check_buffers(count, {src, dst});
    if (count == 0) return;
    launch_for_each("16-bit encode", dtype, count, WireEncodeOp<W, T>{static_cast<const T*>(src), static_cast<W*>(dst)},
                    stream);
  });
}

void launch_wire_decode(const void* src, size_t count, DType wire, DType dtype, void* dst, cudaStream_t stream) {
  half_wire::dispatch(dtype, wire, [&](auto t, auto w) {
    using T = decltype(t);
    using W = decltype(w);
    check_buffers(count, {src, dst});
    if (count == 0) return;
    launch_for_each("16-bit decode", dtype, count, WireDecodeOp<T, W>{static_cast<const W*>(src), static_cast<T*>(dst)},
                    stream);
  });
}

void launch_wire_reduce(const void* src, size_t chunk_len, size_t n_records, DType wire, DType dtype, bool average,
                        void* dst, cudaStream_t stream) {
  if (n_records == 0) throw InvalidArgument("a 16-bit reduction needs at least one record");
  half_wire::dispatch(dtype, wire, [&](auto t, auto w) {
    using T = decltype(t);
    using W = decltype(w);
    check_buffers(chunk_len, {src, dst});
    if (chunk_len == 0) return;
    const float divisor = average ? static_cast<float>(n_records) : 1.0f;
    launch_for_each("16-bit reduce", dtype, chunk_len,
                    WireReduceOp<T, W>{static_cast<const W*>(src), static_cast<T*>(dst), chunk_len, n_records, divisor},
                    stream);
  });
}

}  // namespace cuda
}  // namespace bagua
