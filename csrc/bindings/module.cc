// Entry point of the extension module bagua_core._C.
#include "bindings/bindings.h"

PYBIND11_MODULE(_C, m) {
  m.doc() = "Bagua engine: store, communicators, buffers, XLA FFI handlers";
  bagua::bindings::bind_errors(m);
  bagua::bindings::bind_store(m);
  bagua::bindings::bind_comm(m);
  bagua::bindings::bind_buffer(m);
  bagua::bindings::bind_device(m);
  bagua::bindings::bind_ffi(m);
  bagua::bindings::bind_cuda(m);
  bagua::bindings::bind_compression(m);
  bagua::bindings::bind_kernels_test(m);
  bagua::bindings::bind_kernels(m);
  bagua::bindings::bind_engine(m);
}
