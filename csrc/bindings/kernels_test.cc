// Test-only entry points into the element kernels on raw addresses (Python ints): the float16 /
// bfloat16 conversions of kernels/half.h over whole arrays (tests/core/test_half_conversions.py checks
// them bit for bit against numpy and ml_dtypes) and one CPU reduce loop (timing). Callers pass
// valid host addresses of n elements; nothing here checks them.
#include <pybind11/pybind11.h>

#include <cstdint>

#include "bindings/bindings.h"
#include "common/dtype.h"
#include "common/error.h"
#include "kernels/half.h"
#include "kernels/reduce.h"
#include "kernels/top_byte_pack.h"

namespace py = pybind11;

namespace bagua {
namespace bindings {
namespace {

template <typename H>
void widen(const void* src, void* dst, size_t n) {
  const H* s = static_cast<const H*>(src);
  float* d = static_cast<float*>(dst);
  for (size_t i = 0; i < n; ++i) d[i] = to_float(s[i]);
}

template <typename H>
void narrow(const void* src, void* dst, size_t n) {
  const float* s = static_cast<const float*>(src);
  H* d = static_cast<H*>(dst);
  for (size_t i = 0; i < n; ++i) d[i] = store_f32<H>(s[i]);
}

// dtype 2 (float16) or 3 (bfloat16); to_float: 16-bit elements at src -> float32 at dst,
// otherwise float32 at src -> 16-bit elements at dst (round to nearest even).
void half_convert(uintptr_t src, uintptr_t dst, int64_t n, int dtype, bool to_float32) {
  if (n < 0) throw InvalidArgument("n must not be negative");
  const void* s = reinterpret_cast<const void*>(src);
  void* d = reinterpret_cast<void*>(dst);
  const size_t count = static_cast<size_t>(n);
  if (dtype == static_cast<int>(DType::kFloat16)) {
    to_float32 ? widen<Half>(s, d, count) : narrow<Half>(s, d, count);
  } else if (dtype == static_cast<int>(DType::kBFloat16)) {
    to_float32 ? widen<BFloat16>(s, d, count) : narrow<BFloat16>(s, d, count);
  } else {
    throw InvalidArgument("half_convert needs dtype float16 (2) or bfloat16 (3), got " + std::to_string(dtype));
  }
}

}  // namespace

void bind_kernels_test(py::module_& m) {
  using release = py::call_guard<py::gil_scoped_release>;
  m.def("_half_convert", &half_convert, py::arg("src"), py::arg("dst"), py::arg("n"), py::arg("dtype"),
        py::arg("to_float32"), release(),
        "Test only: converts n float16/bfloat16 elements to float32 (to_float32=True) or back.");
  m.def(
      "_cpu_reduce",
      [](uintptr_t out, uintptr_t a, uintptr_t b, int64_t n, int dtype, int op) {
        if (n < 0) throw InvalidArgument("n must not be negative");
        if (!is_valid_dtype(dtype)) throw InvalidArgument("unknown dtype code " + std::to_string(dtype));
        if (!is_valid_reduce_op(op)) throw InvalidArgument("unknown reduce op " + std::to_string(op));
        cpu_reduce(reinterpret_cast<void*>(out), reinterpret_cast<const void*>(a), reinterpret_cast<const void*>(b),
                   static_cast<size_t>(n), static_cast<DType>(dtype), static_cast<ReduceOp>(op));
      },
      py::arg("out"), py::arg("a"), py::arg("b"), py::arg("n"), py::arg("dtype"), py::arg("op"), release(),
      "Test only: out[i] = a[i] (op) b[i] with the communicators' CPU reduce loop.");
  m.def(
      "_top_byte_pack",
      [](uintptr_t src, int64_t n, uintptr_t dst, int64_t limit) {
        if (n < 0 || limit < 0) throw InvalidArgument("n and limit must not be negative");
        return top_byte_pack(reinterpret_cast<const uint32_t*>(src), static_cast<size_t>(n),
                             reinterpret_cast<uint8_t*>(dst), static_cast<size_t>(limit));
      },
      py::arg("src"), py::arg("n"), py::arg("dst"), py::arg("limit"), release(),
      "Test only: packs n float32 bit patterns (kernels/top_byte_pack.h); returns its size, 0 when not < limit.");
  m.def(
      "_top_byte_unpack",
      [](uintptr_t src, int64_t bytes, int64_t n, uintptr_t dst, bool add) {
        if (n < 0 || bytes < 0) throw InvalidArgument("n and bytes must not be negative");
        const auto* s = reinterpret_cast<const uint8_t*>(src);
        if (add) {
          top_byte_unpack_add(s, static_cast<size_t>(bytes), static_cast<size_t>(n), reinterpret_cast<float*>(dst));
        } else {
          top_byte_unpack(s, static_cast<size_t>(bytes), static_cast<size_t>(n), reinterpret_cast<uint32_t*>(dst));
        }
      },
      py::arg("src"), py::arg("bytes"), py::arg("n"), py::arg("dst"), py::arg("add"), release(),
      "Test only: unpacks a packed segment of n values into dst (add: dst[i] += value i as float32).");
}

}  // namespace bindings
}  // namespace bagua
