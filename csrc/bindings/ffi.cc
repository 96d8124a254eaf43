// Exposes the XLA FFI handlers (csrc/ffi/) as capsules for jax.ffi.register_ffi_target.
//
//   _C.has_xla_ffi        True when the module was built with the handlers
//   _C.ffi_targets()      {platform: {target name: capsule}}, e.g.
//                         {"cpu": {"bagua_allreduce": <capsule>, ...}}
#include "bindings/bindings.h"

#ifdef BAGUA_WITH_XLA_FFI
#include "ffi/targets.h"
#endif

namespace py = pybind11;

namespace bagua {
namespace bindings {

void bind_ffi(py::module_& m) {
#ifdef BAGUA_WITH_XLA_FFI
  m.attr("has_xla_ffi") = true;
  m.def(
      "ffi_targets",
      [] {
        py::dict by_platform;
        for (const auto& t : ffi::targets()) {
          py::str platform(t.platform);
          if (!by_platform.contains(platform)) by_platform[platform] = py::dict();
          // The capsule name is the one XLA uses for custom-call targets.
          by_platform[platform].cast<py::dict>()[py::str(t.name)] =
              py::capsule(t.handler, "xla._CUSTOM_CALL_TARGET");
        }
        return by_platform;
      },
      "{platform: {name: capsule}} of the XLA FFI handlers, for jax.ffi.register_ffi_target.");
#else
  m.attr("has_xla_ffi") = false;
  m.def("ffi_targets", [] { return py::dict(); },
        "Empty: this build has no XLA FFI handlers (jax was not found at build time).");
#endif
}

}  // namespace bindings
}  // namespace bagua
