// Exposes the XLA FFI handlers (csrc/ffi/) as capsules for jax.ffi.register_ffi_target.
//
//   _C.has_xla_ffi        True when the module was built with the handlers
//   _C.has_cuda_ffi       True when it has the CUDA handlers too (CUDA and the
//                         FFI headers at build time); the "CUDA" entries of
//                         ffi_targets() exist exactly then
//   _C.ffi_targets()      {platform: {target name: capsule}}, e.g.
//                         {"cpu": {"bagua_allreduce": <capsule>, ...}, "CUDA": {...}}
//   _C.set_ffi_step_timings(on), _C.ffi_step_timings_on()
//                         record the times of every "bagua_step" call (BAGUA_TRACE)
//   _C.drain_ffi_step_timings()
//                         ([(model, bucket, step, ready, launch, start, end), ...], dropped)
//                         since the last drain (ffi/step_timings.h); empty without handlers
#include <vector>

#include "bindings/bindings.h"

#ifdef BAGUA_WITH_XLA_FFI
#include "ffi/step_timings.h"
#include "ffi/targets.h"
#endif

namespace py = pybind11;

namespace bagua {
namespace bindings {

void bind_ffi(py::module_& m) {
#ifdef BAGUA_WITH_XLA_FFI
  m.attr("has_xla_ffi") = true;
#ifdef BAGUA_WITH_XLA_FFI_CUDA
  m.attr("has_cuda_ffi") = true;
#else
  m.attr("has_cuda_ffi") = false;
#endif
  m.def(
      "ffi_targets",
      [] {
        py::dict by_platform;
        for (const auto& t : ffi::targets()) {
          py::str platform(t.platform);
          if (!by_platform.contains(platform)) by_platform[platform] = py::dict();
          // The capsule name is the one XLA uses for custom-call targets.
          by_platform[platform].cast<py::dict>()[py::str(t.name)] = py::capsule(t.handler, "xla._CUSTOM_CALL_TARGET");
        }
        return by_platform;
      },
      "{platform: {name: capsule}} of the XLA FFI handlers, for jax.ffi.register_ffi_target.");
  m.def("set_ffi_step_timings", &ffi::set_step_timings_on, py::arg("on"));
  m.def("ffi_step_timings_on", &ffi::step_timings_on);
  m.def("drain_ffi_step_timings", [] {
    int64_t dropped = 0;
    const std::vector<ffi::StepTimingRecord> records = ffi::drain_step_timings(&dropped);
    py::list out;
    for (const auto& r : records)
      out.append(py::make_tuple(r.model, r.bucket, r.step, r.timing.ready_ns, r.timing.launch_ns, r.timing.start_ns,
                                r.timing.end_ns));
    return py::make_tuple(out, dropped);
  });
#else
  m.attr("has_xla_ffi") = false;
  m.attr("has_cuda_ffi") = false;
  m.def(
      "ffi_targets", [] { return py::dict(); },
      "Empty: this build has no XLA FFI handlers (jax was not found at build time).");
  m.def("set_ffi_step_timings", [](bool) {}, py::arg("on"));
  m.def("ffi_step_timings_on", [] { return false; });
  m.def("drain_ffi_step_timings", [] { return py::make_tuple(py::list(), 0); });
#endif
}

}  // namespace bindings
}  // namespace bagua
