// Entry point of the extension module bagua_core._C.
#include "bindings/bindings.h"

PYBIND11_MODULE(_C, m) {
  m.doc() = "Bagua engine: store, communicators, buffers, XLA FFI handlers";
#ifdef BAGUA_WITH_TEST_BINDINGS
  m.attr("_test_bindings") = true;
#else
  m.attr("_test_bindings") = false;  // built with -DBAGUA_TEST_BINDINGS=OFF
#endif
  bagua::bindings::bind_errors(m);
  bagua::bindings::bind_store(m);
  bagua::bindings::bind_comm(m);
  bagua::bindings::bind_buffer(m);
  bagua::bindings::bind_device(m);
  bagua::bindings::bind_ffi(m);
  bagua::bindings::bind_cuda(m);
  bagua::bindings::bind_compression(m);
#ifdef BAGUA_WITH_TEST_BINDINGS
  bagua::bindings::bind_kernels_test(m);
  bagua::bindings::bind_kernels(m);
#endif
  bagua::bindings::bind_engine(m);
}
