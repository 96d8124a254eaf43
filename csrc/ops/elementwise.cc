#include "ops/elementwise.h"

#include <string>
#include <type_traits>

namespace bagua {
namespace {

template <typename T>
void average_loop(T* __restrict acc, const T* __restrict other, size_t count) {
  for (size_t i = 0; i < count; ++i) acc[i] = AverageMath<T>::average(acc[i], other[i]);
}

inline float to_acc(float x) { return x; }
inline double to_acc(double x) { return x; }

template <typename T>
void diff_loop(T* t, const T* w, const T* l, const T* r, size_t count) {
  for (size_t i = 0; i < count; ++i) t[i] = ReplicaMath<T>::diff(t[i], w[i], l[i], r[i]);
}

template <typename T>
void add_loop(T* __restrict acc, const T* __restrict other, size_t count) {
  for (size_t i = 0; i < count; ++i) acc[i] = ReplicaMath<T>::add(acc[i], other[i]);
}

template <typename T, typename A>
void momentum_loop(T* __restrict m, const T* __restrict g, size_t count, double beta) {
  const A b = MomentumMath<A>::beta(beta);
  const A c = MomentumMath<A>::one_minus_beta(beta);
  for (size_t i = 0; i < count; ++i)
    m[i] = static_cast<T>(MomentumMath<A>::update(static_cast<A>(to_acc(m[i])), static_cast<A>(to_acc(g[i])), b, c));
}

template <typename T>
void apply_average_loop(T* __restrict w, const T* __restrict snapshot, const T* __restrict avg, size_t count) {
  for (size_t i = 0; i < count; ++i) w[i] = AsyncAverageMath<T>::apply(w[i], snapshot[i], avg[i]);
}

template <typename T>
void async_local_step_loop(T* w, const T* p, const T* u, T* out, size_t count) {
  for (size_t i = 0; i < count; ++i) {
    const T moved = AsyncStepMath<T>::update(w[i], u[i], p[i]);
    out[i] = moved;
    w[i] = AsyncStepMath<T>::apply(p[i], moved);
  }
}

template <typename T>
void async_warmup_step_loop(T* __restrict w, const T* __restrict p, const T* __restrict u, size_t count) {
  for (size_t i = 0; i < count; ++i) w[i] = AsyncStepMath<T>::apply(p[i], u[i]);
}

}  // namespace

void apply_average_cpu(void* w, const void* snapshot, const void* avg, size_t count, DType dtype) {
  with_floating(dtype, "applying a model average", [&](auto* tag) {
    using T = std::remove_pointer_t<decltype(tag)>;
    apply_average_loop(static_cast<T*>(w), static_cast<const T*>(snapshot), static_cast<const T*>(avg), count);
  });
}

void async_local_step_cpu(void* w, const void* p, const void* u, void* out, size_t count, DType dtype) {
  with_floating(dtype, "asynchronous model average's training step", [&](auto* tag) {
    using T = std::remove_pointer_t<decltype(tag)>;
    async_local_step_loop(static_cast<T*>(w), static_cast<const T*>(p), static_cast<const T*>(u), static_cast<T*>(out),
                          count);
  });
}

void async_warmup_step_cpu(void* w, const void* p, const void* u, size_t count, DType dtype) {
  with_floating(dtype, "asynchronous model average's warm-up step", [&](auto* tag) {
    using T = std::remove_pointer_t<decltype(tag)>;
    async_warmup_step_loop(static_cast<T*>(w), static_cast<const T*>(p), static_cast<const T*>(u), count);
  });
}

void momentum_update_cpu(void* m, const void* g, size_t count, DType dtype, double beta) {
  with_momentum_dtype(dtype, [&](auto* tag) {
    using T = std::remove_pointer_t<decltype(tag)>;
    momentum_loop<T, T>(static_cast<T*>(m), static_cast<const T*>(g), count, beta);
  });
}

void replica_diff_cpu(void* t, const void* w, const void* l, const void* r, size_t count, DType dtype) {
  with_floating(dtype, "the replica difference", [&](auto* tag) {
    using T = std::remove_pointer_t<decltype(tag)>;
    diff_loop(static_cast<T*>(t), static_cast<const T*>(w), static_cast<const T*>(l), static_cast<const T*>(r), count);
  });
}

void add_into_cpu(void* acc, const void* other, size_t count, DType dtype) {
  with_floating(dtype, "adding", [&](auto* tag) {
    using T = std::remove_pointer_t<decltype(tag)>;
    add_loop(static_cast<T*>(acc), static_cast<const T*>(other), count);
  });
}

bool is_floating(DType dtype) {
  return dtype == DType::kFloat32 || dtype == DType::kFloat64 || dtype == DType::kFloat16 || dtype == DType::kBFloat16;
}

void average_into_cpu(void* acc, const void* other, size_t count, DType dtype) {
  switch (dtype) {
    case DType::kFloat32: return average_loop(static_cast<float*>(acc), static_cast<const float*>(other), count);
    case DType::kFloat64: return average_loop(static_cast<double*>(acc), static_cast<const double*>(other), count);
    case DType::kFloat16: return average_loop(static_cast<Half*>(acc), static_cast<const Half*>(other), count);
    case DType::kBFloat16: return average_loop(static_cast<BFloat16*>(acc), static_cast<const BFloat16*>(other), count);
    default: throw InvalidArgument(std::string("averaging needs a floating dtype, got ") + dtype_name(dtype));
  }
}

}  // namespace bagua

namespace bagua {

void pseudo_gradient_cpu(void* d, const void* a, size_t count, DType dtype) {
  with_floating(dtype, "the pseudo-gradient", [&](auto* tag) {
    using T = std::remove_pointer_t<decltype(tag)>;
    T* dd = static_cast<T*>(d);
    const T* aa = static_cast<const T*>(a);
    for (size_t i = 0; i < count; ++i) outer_pseudo_gradient(dd[i], aa[i]);
  });
}

void outer_sgd_cpu(void* w, void* a, void* m, const void* d, size_t count, DType dtype, double lr, double mu,
                   bool nesterov, bool fresh) {
  with_floating(dtype, "the outer optimizer step", [&](auto* tag) {
    using T = std::remove_pointer_t<decltype(tag)>;
    using A = typename OuterAcc<T>::type;
    T* ww = static_cast<T*>(w);
    T* aa = static_cast<T*>(a);
    T* mm = static_cast<T*>(m);
    const T* dd = static_cast<const T*>(d);
    const A alr = static_cast<A>(lr), amu = static_cast<A>(mu);
    for (size_t i = 0; i < count; ++i) outer_sgd_element(ww[i], aa[i], mm[i], dd[i], alr, amu, nesterov, fresh);
  });
}

void outer_mix_cpu(void* w, const void* a, size_t count, DType dtype, double alpha) {
  with_floating(dtype, "the fragment merge", [&](auto* tag) {
    using T = std::remove_pointer_t<decltype(tag)>;
    using A = typename OuterAcc<T>::type;
    T* ww = static_cast<T*>(w);
    const T* aa = static_cast<const T*>(a);
    const A al = static_cast<A>(alpha);
    for (size_t i = 0; i < count; ++i) outer_mix_element(ww[i], aa[i], al);
  });
}

}  // namespace bagua
