// Each part of the engine binds itself into the module from its own file.
#pragma once

#include <pybind11/pybind11.h>

#include <cstddef>
#include <cstdint>
#include <string>

#include "common/dtype.h"
#include "common/error.h"

namespace bagua {
namespace bindings {

// Argument conversions the binding files share.
inline DType to_dtype(int code) {
  if (!is_valid_dtype(code)) throw InvalidArgument("unknown dtype code " + std::to_string(code));
  return static_cast<DType>(code);
}
inline size_t to_size(int64_t v, const char* what) {
  if (v < 0) throw InvalidArgument(std::string(what) + " must not be negative");
  return static_cast<size_t>(v);
}

void bind_errors(pybind11::module_& m);
void bind_store(pybind11::module_& m);
void bind_comm(pybind11::module_& m);
void bind_buffer(pybind11::module_& m);
void bind_device(pybind11::module_& m);       // Device: CUDA, or the host implementation
void bind_ffi(pybind11::module_& m);          // no-op when built without jax
void bind_cuda(pybind11::module_& m);         // reports availability; no-op without CUDA
void bind_compression(pybind11::module_& m);  // MinMaxUInt8 on raw addresses
// Test-only (compiled with BAGUA_TEST_BINDINGS, CMakeLists.txt):
void bind_kernels_test(pybind11::module_& m);  // half conversions, CPU reduce loop, wire packing
void bind_kernels(pybind11::module_& m);       // _C.kernels: element and step kernels, host and CUDA
void bind_engine(pybind11::module_& m);        // buckets, scheduler, algorithm ops

}  // namespace bindings
}  // namespace bagua
