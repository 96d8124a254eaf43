// Maps engine exceptions to Python classes; see bagua_core/errors.py.
#include <pybind11/pybind11.h>

#include <stdexcept>
#include <string>

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
#ifdef BAGUA_WITH_TEST_BINDINGS
  // Test-only: raises an error of `kind` passed through with_prefix (common/error.h),
  // so tests check that every engine error type keeps its type (and a peer its rank).
  m.def("_raise_with_prefix", [](const std::string& kind, const std::string& prefix) {
    std::exception_ptr e;
    if (kind == "timeout")
      e = std::make_exception_ptr(TimeoutError("late"));
    else if (kind == "peer")
      e = std::make_exception_ptr(PeerError("gone", 3));
    else if (kind == "mismatch")
      e = std::make_exception_ptr(MismatchError("differs"));
    else if (kind == "error")
      e = std::make_exception_ptr(Error("failed"));
    else if (kind == "invalid")
      e = std::make_exception_ptr(InvalidArgument("bad"));
    else if (kind == "std")
      e = std::make_exception_ptr(std::runtime_error("foreign"));
    else
      e = std::make_exception_ptr(42);
    std::rethrow_exception(with_prefix(e, prefix));
  });
#endif
}

}  // namespace bindings
}  // namespace bagua
