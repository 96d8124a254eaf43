// DType, DLPack import (DLPackView), core-owned buffers (Buffer) and their
// DLPack export. The Python-facing protocol logic lives in bagua_core/dlpack.py.
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <optional>
#include <string>

#include "bindings/bindings.h"
#include "bindings/dlpack_capsule.h"
#include "buffer/buffer.h"
#include "dlpack/dtype.h"
#include "dlpack/view.h"

namespace py = pybind11;

namespace bagua {
namespace bindings {
namespace {

const char* device_name(DeviceType d) { return d == DeviceType::kCPU ? "cpu" : "cuda"; }

DeviceType parse_device(const std::string& s) {
  if (s == "cpu") return DeviceType::kCPU;
  if (s == "cuda") return DeviceType::kCUDA;
  throw InvalidArgument("unknown device '" + s + "' (use 'cpu' or 'cuda')");
}

py::tuple to_tuple(const std::vector<int64_t>& v) {
  py::tuple t(v.size());
  for (size_t i = 0; i < v.size(); ++i) t[i] = py::int_(v[i]);
  return t;
}

// Takes the tensor out of a capsule. The capsule is renamed first ("used_..."),
// so it never calls the deleter itself: from now on the view owns the tensor.
std::unique_ptr<DLPackView> adopt_capsule(const py::handle& cap, std::optional<DType> as) {
  PyObject* o = cap.ptr();
  if (PyCapsule_IsValid(o, kDLTensorVersionedName)) {
    auto* t = static_cast<DLManagedTensorVersioned*>(PyCapsule_GetPointer(o, kDLTensorVersionedName));
    PyCapsule_SetName(o, kUsedDLTensorVersionedName);
    return DLPackView::adopt(t, as);
  }
  if (PyCapsule_IsValid(o, kDLTensorName)) {
    auto* t = static_cast<DLManagedTensor*>(PyCapsule_GetPointer(o, kDLTensorName));
    PyCapsule_SetName(o, kUsedDLTensorName);
    return DLPackView::adopt(t, as);
  }
  if (PyCapsule_IsValid(o, kUsedDLTensorVersionedName) || PyCapsule_IsValid(o, kUsedDLTensorName)) {
    throw InvalidArgument("this DLPack capsule was already consumed");
  }
  throw py::type_error("expected a DLPack capsule (from __dlpack__()), got " +
                       std::string(py::str(py::type::of(cap).attr("__name__"))));
}

DLDevice dl_device_of(const Buffer& b) {
  if (b.device_type() == DeviceType::kCPU) return {kDLCPU, 0};
  return {kDLCUDA, b.device_index()};
}

py::object export_buffer(const Buffer& self, py::object stream, py::object max_version, py::object dl_device,
                         py::object copy) {
  // stream is irrelevant: Bagua finishes writing a buffer before its
  // primitive returns. copy=True exports a fresh copy, otherwise a view.
  DLDevice dev = dl_device_of(self);
  check_requested_device(dl_device, dev, "bagua_core.Buffer");
  bool copied = copy_requested(copy);
  Buffer b = self;
  if (copied) {
    b = Buffer(self.shape(), self.dtype(), self.device_type(), self.device_index());
    copy_bytes(b.data(), self.data(), self.nbytes(), self.device_type());
  }
  return make_dlpack_capsule(ExportSpec{b.storage(), b.data(), b.shape(), b.dtype(), dev, false, copied}, max_version);
}

// numpy cannot name bfloat16 in DLPack: view the bits as uint16 and let
// ml_dtypes (installed with jax) name them.
py::object buffer_to_numpy(const Buffer& b) {
  if (b.device_type() != DeviceType::kCPU) {
    throw InvalidArgument("Buffer.numpy() needs host memory; this buffer is on cuda");
  }
  py::module_ np = py::module_::import("numpy");
  if (b.dtype() != DType::kBFloat16) return np.attr("from_dlpack")(py::cast(b));
  py::object ml_dtypes;
  try {
    ml_dtypes = py::module_::import("ml_dtypes");
  } catch (py::error_already_set&) {
    throw py::type_error(
        "numpy has no bfloat16: install ml_dtypes, or view the buffer with "
        "torch.from_dlpack / jax.numpy.from_dlpack");
  }
  // float16 has bfloat16's size; numpy's .view() then renames the bits.
  py::object bits = np.attr("from_dlpack")(py::cast(b.view(DType::kFloat16)));
  return bits.attr("view")(ml_dtypes.attr("bfloat16"));
}

}  // namespace

void bind_buffer(py::module_& m) {
  py::register_exception_translator([](std::exception_ptr p) {
    try {
      if (p) std::rethrow_exception(p);
    } catch (const UnsupportedType& e) {
      py::set_error(PyExc_TypeError, e.what());
    }
  });

  py::enum_<DType>(m, "DType", py::arithmetic(), "Element types Bagua communicates.")
      .value("float32", DType::kFloat32)
      .value("float64", DType::kFloat64)
      .value("float16", DType::kFloat16)
      .value("bfloat16", DType::kBFloat16)
      .value("int32", DType::kInt32)
      .value("int64", DType::kInt64)
      .value("uint8", DType::kUInt8)
      .def_property_readonly("itemsize", [](DType t) { return dtype_size(t); });

  py::class_<DLPackView>(m, "DLPackView", R"doc(
An array borrowed zero-copy through DLPack. Holds the producer's memory alive
until the view is garbage collected, then calls the producer's deleter.
Built from a capsule returned by ``__dlpack__``; see bagua_core.dlpack.import_array.)doc")
      .def(py::init([](const py::object& capsule, std::optional<DType> dtype, bool read_only) {
             std::unique_ptr<DLPackView> v = adopt_capsule(capsule, dtype);
             if (read_only) v->mark_read_only();
             return v;
           }),
           py::arg("capsule"), py::arg("dtype") = py::none(), py::arg("read_only") = false)
      .def_property_readonly("address", [](const DLPackView& v) { return reinterpret_cast<uintptr_t>(v.data()); })
      .def_property_readonly("numel", &DLPackView::numel)
      .def_property_readonly("nbytes", &DLPackView::nbytes)
      .def_property_readonly("shape", [](const DLPackView& v) { return to_tuple(v.shape()); })
      .def_property_readonly("dtype", &DLPackView::dtype)
      .def_property_readonly("device_type", [](const DLPackView& v) { return device_name(v.device_type()); })
      .def_property_readonly("device_index", &DLPackView::device_index)
      .def_property_readonly("read_only", &DLPackView::read_only)
      .def("__repr__", [](const DLPackView& v) {
        return "DLPackView(shape=" + std::string(py::repr(to_tuple(v.shape()))) + ", dtype=" + dtype_name(v.dtype()) +
               ", device=" + device_name(v.device_type()) + ":" + std::to_string(v.device_index()) +
               (v.read_only() ? ", read_only" : "") + ")";
      });

  py::class_<Buffer>(m, "Buffer", R"doc(
Memory owned by the engine (host: 64-byte aligned; cuda: cudaMalloc), viewed
zero-copy by numpy, torch and JAX through DLPack (``np.from_dlpack(buf)``,
``torch.from_dlpack(buf)``, ``jax.numpy.from_dlpack(buf)``). The memory lives as
long as the buffer or any view of it.)doc")
      .def(
          py::init([](std::vector<int64_t> shape, DType dtype, const std::string& device, int device_index, bool zero) {
            return Buffer(std::move(shape), dtype, parse_device(device), device_index, zero);
          }),
          py::arg("shape"), py::arg("dtype"), py::arg("device") = "cpu", py::arg("device_index") = 0,
          py::arg("zero") = false)
      .def_property_readonly("shape", [](const Buffer& b) { return to_tuple(b.shape()); })
      .def_property_readonly("dtype", &Buffer::dtype)
      .def_property_readonly("numel", &Buffer::numel)
      .def_property_readonly("nbytes", &Buffer::nbytes)
      .def_property_readonly("address", [](const Buffer& b) { return reinterpret_cast<uintptr_t>(b.data()); })
      .def_property_readonly("device_type", [](const Buffer& b) { return device_name(b.device_type()); })
      .def_property_readonly("device_index", &Buffer::device_index)
      .def("view", &Buffer::view, py::arg("dtype"),
           "The same memory read as another dtype (1-D when element sizes differ).")
      .def("numpy", &buffer_to_numpy, "A numpy view (host buffers; bfloat16 needs ml_dtypes).")
      .def("__dlpack__", &export_buffer, py::kw_only(), py::arg("stream") = py::none(),
           py::arg("max_version") = py::none(), py::arg("dl_device") = py::none(), py::arg("copy") = py::none())
      .def("__dlpack_device__",
           [](const Buffer& b) {
             DLDevice d = dl_device_of(b);
             return py::make_tuple(static_cast<int>(d.device_type), d.device_id);
           })
      .def("__len__",
           [](const Buffer& b) {
             if (b.shape().empty()) throw py::type_error("len() of a 0-d buffer");
             return b.shape()[0];
           })
      .def("__repr__", [](const Buffer& b) {
        return "Buffer(shape=" + std::string(py::repr(to_tuple(b.shape()))) + ", dtype=" + dtype_name(b.dtype()) +
               ", device=" + device_name(b.device_type()) + ":" + std::to_string(b.device_index()) + ")";
      });

  m.def(
      "copy_memory",
      [](uintptr_t dst, uintptr_t src, size_t nbytes, const std::string& device) {
        DeviceType d = parse_device(device);
        py::gil_scoped_release release;
        copy_bytes(reinterpret_cast<void*>(dst), reinterpret_cast<const void*>(src), nbytes, d);
      },
      py::arg("dst"), py::arg("src"), py::arg("nbytes"), py::arg("device") = "cpu",
      "memmove between raw addresses (host, or device-to-device on cuda).");
}

}  // namespace bindings
}  // namespace bagua
