#include "bindings/dlpack_capsule.h"

#include <utility>

namespace py = pybind11;

namespace bagua {
namespace bindings {
namespace {

// A capsule the consumer never took still owns its tensor.
template <typename Managed>
void capsule_destructor(PyObject* cap, const char* name) {
  if (PyCapsule_IsValid(cap, name)) {
    auto* t = static_cast<Managed*>(PyCapsule_GetPointer(cap, name));
    if (t && t->deleter) t->deleter(t);
  }
}

void versioned_destructor(PyObject* cap) { capsule_destructor<DLManagedTensorVersioned>(cap, kDLTensorVersionedName); }
void legacy_destructor(PyObject* cap) { capsule_destructor<DLManagedTensor>(cap, kDLTensorName); }

// (a, b) from a pair of ints, or TypeError naming the argument.
std::pair<int, int> int_pair(const py::handle& v, const char* arg, const char* form) {
  if (py::isinstance<py::sequence>(v) && !py::isinstance<py::str>(v)) {
    auto seq = py::reinterpret_borrow<py::sequence>(v);
    if (seq.size() == 2) {
      try {
        return {seq[0].cast<int>(), seq[1].cast<int>()};
      } catch (const py::cast_error&) {
      }
    }
  }
  throw py::type_error(std::string("__dlpack__: ") + arg + " must be None or a " + form + " pair, got " +
                       std::string(py::repr(v)));
}

template <typename Managed>
py::object wrap(Managed* t, const char* name, PyCapsule_Destructor destructor) {
  PyObject* cap = PyCapsule_New(t, name, destructor);
  if (cap == nullptr) {
    t->deleter(t);
    throw py::error_already_set();
  }
  return py::reinterpret_steal<py::object>(cap);
}

}  // namespace

void raise_buffer_error(const std::string& msg) {
  PyErr_SetString(PyExc_BufferError, msg.c_str());
  throw py::error_already_set();
}

void check_requested_device(const py::handle& dl_device, DLDevice have, const std::string& what) {
  if (dl_device.is_none()) return;
  auto want = int_pair(dl_device, "dl_device", "(device_type, device_id)");
  if (want.first != have.device_type || want.second != have.device_id)
    raise_buffer_error(what + " cannot be exported to another device");
}

bool copy_requested(const py::handle& copy) {
  if (copy.is_none()) return false;
  if (!py::isinstance<py::bool_>(copy))
    throw py::type_error("__dlpack__: copy must be None or a bool, got " + std::string(py::repr(copy)));
  return copy.cast<bool>();
}

py::object make_dlpack_capsule(ExportSpec spec, const py::handle& max_version) {
  bool versioned = false;
  if (!max_version.is_none())
    versioned = int_pair(max_version, "max_version", "(major, minor)").first >= DLPACK_MAJOR_VERSION;
  if (versioned) return wrap(export_versioned(std::move(spec)), kDLTensorVersionedName, versioned_destructor);
  return wrap(export_legacy(std::move(spec)), kDLTensorName, legacy_destructor);
}

}  // namespace bindings
}  // namespace bagua
