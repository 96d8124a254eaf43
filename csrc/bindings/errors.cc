// Maps engine exceptions to Python classes; see bagua_core/errors.py.
#include <pybind11/pybind11.h>

#include "bindings/bindings.h"
#include "common/error.h"

namespace py = pybind11;

namespace bagua {
namespace bindings {

void bind_errors(py::module_& m) {
  static py::exception<Error> base(m, "BaguaError", PyExc_RuntimeError);
  static py::exception<TimeoutError> timeout(m, "CommTimeoutError", base.ptr());
  static py::exception<PeerError> peer(m, "PeerError", base.ptr());
  static py::exception<MismatchError> mismatch(m, "MismatchError", base.ptr());
  py::register_exception_translator([](std::exception_ptr p) {
    try {
      if (p) std::rethrow_exception(p);
    } catch (const TimeoutError& e) {
      py::set_error(timeout, e.what());
    } catch (const PeerError& e) {
      py::set_error(peer, e.what());
    } catch (const MismatchError& e) {
      py::set_error(mismatch, e.what());
    } catch (const Error& e) {
      py::set_error(base, e.what());
    } catch (const InvalidArgument& e) {
      py::set_error(PyExc_ValueError, e.what());
    }
  });
}

}  // namespace bindings
}  // namespace bagua
