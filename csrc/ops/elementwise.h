// Element math of the decentralized ops, written once for CPU loops and CUDA
// kernels (kernels/cuda_kernels.h). float16/bfloat16 compute in float32 and
// round once on store. Neither side contracts a * b + c into an FMA
// (CMakeLists.txt), so the kernels give the host loops' bits (NaN payloads aside).
#pragma once

#include <cstddef>
#include <string>

#include "common/dtype.h"
#include "common/error.h"
#include "kernels/half.h"
#include "kernels/hd.h"

namespace bagua {

template <typename T>
struct AverageMath {
  static BAGUA_HD T average(T a, T b) { return (a + b) / T(2); }
};
template <>
struct AverageMath<Half> {
  static BAGUA_HD Half average(Half a, Half b) { return to_half((to_float(a) + to_float(b)) * 0.5f); }
};
template <>
struct AverageMath<BFloat16> {
  static BAGUA_HD BFloat16 average(BFloat16 a, BFloat16 b) { return to_bfloat16((to_float(a) + to_float(b)) * 0.5f); }
};

// Low-precision decentralized SGD's difference (ops/low_precision_decentralized.h):
//   t = t + l / 3 + r / 3 - w * (5 / 3)
// evaluated left to right in float32 (float64 for float64 data).
template <typename T>
struct ReplicaMath {
  static BAGUA_HD T diff(T t, T w, T l, T r) { return t + l / T(3) + r / T(3) - w * (T(5) / T(3)); }
  static BAGUA_HD T add(T a, T b) { return a + b; }
};
template <>
struct ReplicaMath<Half> {
  static BAGUA_HD Half diff(Half t, Half w, Half l, Half r) {
    return to_half(ReplicaMath<float>::diff(to_float(t), to_float(w), to_float(l), to_float(r)));
  }
  static BAGUA_HD Half add(Half a, Half b) { return to_half(to_float(a) + to_float(b)); }
};
template <>
struct ReplicaMath<BFloat16> {
  static BAGUA_HD BFloat16 diff(BFloat16 t, BFloat16 w, BFloat16 l, BFloat16 r) {
    return to_bfloat16(ReplicaMath<float>::diff(to_float(t), to_float(w), to_float(l), to_float(r)));
  }
  static BAGUA_HD BFloat16 add(BFloat16 a, BFloat16 b) { return to_bfloat16(to_float(a) + to_float(b)); }
};

// QAdam's momentum update (ops/qadam.h), in float32 (float64 for float64):
//   m = beta * m + (1 - beta) * g, with beta and 1 - beta rounded to that type once.
template <typename T>
struct MomentumMath {
  // The two coefficients from the step's beta (host side, once per call).
  static T beta(double beta) { return static_cast<T>(beta); }
  static T one_minus_beta(double beta) { return static_cast<T>(1.0 - beta); }
  static BAGUA_HD T update(T m, T g, T beta, T one_minus_beta) { return beta * m + one_minus_beta * g; }
};

// Asynchronous model average's copy-back (ops/async_model_average.h):
//   w = avg + (w - snapshot)
// keeps the local progress made since the snapshot; exactly avg where the
// weights did not change. float16/bfloat16 compute in float32.
template <typename T>
struct AsyncAverageMath {
  static BAGUA_HD T apply(T w, T snapshot, T avg) { return avg + (w - snapshot); }
};
template <>
struct AsyncAverageMath<Half> {
  static BAGUA_HD Half apply(Half w, Half s, Half a) { return to_half(to_float(a) + (to_float(w) - to_float(s))); }
};
template <>
struct AsyncAverageMath<BFloat16> {
  static BAGUA_HD BFloat16 apply(BFloat16 w, BFloat16 s, BFloat16 a) {
    return to_bfloat16(to_float(a) + (to_float(w) - to_float(s)));
  }
};

// Asynchronous model average's training step (sched/async_weights.h), in the
// weights' dtype with a rounding after every operation, as optax computes it:
//   update: u' = (w + u) - p, the optimizer's update u for weights p moved
//           onto the weights w the loop averaged since;
//   apply:  w = p + u', exactly what optax.apply_updates(p, u') gives.
template <typename T>
struct AsyncStepMath {
  static BAGUA_HD T update(T w, T u, T p) { return (w + u) - p; }
  static BAGUA_HD T apply(T p, T u) { return p + u; }
};
template <>
struct AsyncStepMath<Half> {
  static BAGUA_HD Half update(Half w, Half u, Half p) {
    return to_half(to_float(to_half(to_float(w) + to_float(u))) - to_float(p));
  }
  static BAGUA_HD Half apply(Half p, Half u) { return to_half(to_float(p) + to_float(u)); }
};
template <>
struct AsyncStepMath<BFloat16> {
  static BAGUA_HD BFloat16 update(BFloat16 w, BFloat16 u, BFloat16 p) {
    return to_bfloat16(to_float(to_bfloat16(to_float(w) + to_float(u))) - to_float(p));
  }
  static BAGUA_HD BFloat16 apply(BFloat16 p, BFloat16 u) { return to_bfloat16(to_float(p) + to_float(u)); }
};

// Local steps' outer optimizer (ops/local_steps.h), in float32 (float64 for
// float64 data); float16/bfloat16 round once on store:
//   pseudo_gradient: d = a - w (how far the weights moved from the anchor)
//   outer: m = fresh ? d : mu * m + d;  u = nesterov ? d + mu * m : m;
//          a = a - lr * u;  w = a
// `fresh` ignores the old m (the first outer step: m starts at zero).
template <typename A>
struct OuterSgdMath {
  static BAGUA_HD A pseudo_gradient(A a, A w) { return a - w; }
  static BAGUA_HD A momentum(A m, A d, A mu, bool fresh) { return fresh ? d : mu * m + d; }
  static BAGUA_HD A update(A m, A d, A mu, bool nesterov) { return nesterov ? d + mu * m : m; }
  static BAGUA_HD A anchor(A a, A u, A lr) { return a - lr * u; }
};
// The element type the outer step computes in: float for float and the 16-bit types, double for double.
template <typename T>
struct OuterAcc {
  using type = float;
};
template <>
struct OuterAcc<double> {
  using type = double;
};

BAGUA_HD float outer_load(float x) { return x; }
BAGUA_HD double outer_load(double x) { return x; }
BAGUA_HD float outer_load(Half x) { return to_float(x); }
BAGUA_HD float outer_load(BFloat16 x) { return to_float(x); }
template <typename T>
BAGUA_HD T outer_store(typename OuterAcc<T>::type x) {
  return x;
}
template <>
BAGUA_HD Half outer_store<Half>(float x) {
  return to_half(x);
}
template <>
BAGUA_HD BFloat16 outer_store<BFloat16>(float x) {
  return to_bfloat16(x);
}

// d <- a - d (d holds the weights on entry).
template <typename T>
BAGUA_HD void outer_pseudo_gradient(T& d, T a) {
  using A = typename OuterAcc<T>::type;
  d = outer_store<T>(OuterSgdMath<A>::pseudo_gradient(outer_load(a), outer_load(d)));
}

// One element of the outer step: m, a and w from d (the averaged pseudo-gradient).
template <typename T>
BAGUA_HD void outer_sgd_element(T& w, T& a, T& m, T d, typename OuterAcc<T>::type lr, typename OuterAcc<T>::type mu,
                                bool nesterov, bool fresh) {
  using A = typename OuterAcc<T>::type;
  const A di = outer_load(d);
  const A mi = OuterSgdMath<A>::momentum(fresh ? A(0) : outer_load(m), di, mu, fresh);
  const A ai = OuterSgdMath<A>::anchor(outer_load(a), OuterSgdMath<A>::update(mi, di, mu, nesterov), lr);
  m = outer_store<T>(mi);
  a = outer_store<T>(ai);
  w = a;
}

// Streaming local steps' merge of a fragment: w = alpha * w + (1 - alpha) * a,
// the local weights w mixed with the new anchor a (alpha = 0: w = a exactly).
template <typename T>
BAGUA_HD void outer_mix_element(T& w, T a, typename OuterAcc<T>::type alpha) {
  using A = typename OuterAcc<T>::type;
  w = outer_store<T>(alpha * outer_load(w) + (A(1) - alpha) * outer_load(a));
}

// Calls f(T*) (a null tag) with T the element type of a floating dtype (float,
// double, Half, BFloat16); InvalidArgument naming `what` for other dtypes.
// The host loops and the CUDA launchers (kernels/cuda_kernels.cu) dispatch
// through these, so both accept the same dtypes.
template <typename F>
void with_floating(DType dtype, const char* what, F&& f) {
  switch (dtype) {
    case DType::kFloat32: return f(static_cast<float*>(nullptr));
    case DType::kFloat64: return f(static_cast<double*>(nullptr));
    case DType::kFloat16: return f(static_cast<Half*>(nullptr));
    case DType::kBFloat16: return f(static_cast<BFloat16*>(nullptr));
    default: throw InvalidArgument(std::string(what) + " needs a floating dtype, got " + dtype_name(dtype));
  }
}
// As with_floating for float32 and float64 only (the low-rank step's compute types, ops/low_rank_math.h).
template <typename F>
void with_compute_dtype(DType dtype, const char* what, F&& f) {
  switch (dtype) {
    case DType::kFloat32: return f(static_cast<float*>(nullptr));
    case DType::kFloat64: return f(static_cast<double*>(nullptr));
    default:
      throw InvalidArgument(std::string(what) + ": the compute dtype must be float32 or float64, got " +
                            dtype_name(dtype));
  }
}
// As with_floating for QAdam's momentum, which takes float32 and float64 only.
template <typename F>
void with_momentum_dtype(DType dtype, F&& f) {
  switch (dtype) {
    case DType::kFloat32: return f(static_cast<float*>(nullptr));
    case DType::kFloat64: return f(static_cast<double*>(nullptr));
    default: throw InvalidArgument(std::string("QAdam's momentum needs float32 or float64, got ") + dtype_name(dtype));
  }
}

// w[i] = AsyncAverageMath::apply(w[i], snapshot[i], avg[i]) on host memory (floating dtypes).
void apply_average_cpu(void* w, const void* snapshot, const void* avg, size_t count, DType dtype);

// The training step of asynchronous model average on host memory (AsyncStepMath; floating dtypes):
//   out[i] = update(w[i], u[i], p[i]); w[i] = apply(p[i], out[i]). `out` may alias `u`.
void async_local_step_cpu(void* w, const void* p, const void* u, void* out, size_t count, DType dtype);
// w[i] = AsyncStepMath::apply(p[i], u[i]) (the warm-up steps: the averaged update as it is).
void async_warmup_step_cpu(void* w, const void* p, const void* u, size_t count, DType dtype);

// m[i] = MomentumMath::update(m[i], g[i], beta, 1 - beta) on host memory (floating dtypes).
void momentum_update_cpu(void* m, const void* g, size_t count, DType dtype, double beta);

// d[i] = a[i] - d[i]: on entry d holds the weights (OuterSgdMath::pseudo_gradient; floating dtypes).
void pseudo_gradient_cpu(void* d, const void* a, size_t count, DType dtype);
// One outer SGD step per element (OuterSgdMath): reads d (the averaged pseudo-
// gradient) and writes m, a and w (w = the new anchor).
// w[i] = alpha * w[i] + (1 - alpha) * a[i] (outer_mix_element; floating dtypes).
void outer_mix_cpu(void* w, const void* a, size_t count, DType dtype, double alpha);
void outer_sgd_cpu(void* w, void* a, void* m, const void* d, size_t count, DType dtype, double lr, double mu,
                   bool nesterov, bool fresh);

// t[i] = ReplicaMath::diff(t[i], w[i], l[i], r[i]) on host memory (floating dtypes).
void replica_diff_cpu(void* t, const void* w, const void* l, const void* r, size_t count, DType dtype);
// acc[i] = acc[i] + other[i] on host memory (floating dtypes).
void add_into_cpu(void* acc, const void* other, size_t count, DType dtype);

// acc[i] = (acc[i] + other[i]) / 2 on host memory, for floating dtypes.
// Throws InvalidArgument for other dtypes.
void average_into_cpu(void* acc, const void* other, size_t count, DType dtype);

// True for the dtypes average_into_cpu accepts.
bool is_floating(DType dtype);

}  // namespace bagua
