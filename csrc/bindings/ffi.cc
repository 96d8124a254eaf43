// Exposes the XLA FFI handlers (csrc/ffi/) as capsules for jax.ffi.register_ffi_target.
#include "bindings/bindings.h"

namespace py = pybind11;

namespace bagua {
namespace bindings {

void bind_ffi(py::module_& m) {
#ifdef BAGUA_WITH_XLA_FFI
  m.attr("has_xla_ffi") = true;
#else
  m.attr("has_xla_ffi") = false;
#endif
}

}  // namespace bindings
}  // namespace bagua
