// Devices (device/device.h) for Python: the CUDA device of an index, or the
// host implementation on which the suite runs the device path. Streams cross
// as ints (cudaStream_t, or the host queue). Blocking calls release the GIL.
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <chrono>
#include <cmath>
#include <cstring>
#include <memory>
#include <optional>
#include <string>

#include "bindings/bindings.h"
#include "common/error.h"
#include "device/device.h"

namespace py = pybind11;

namespace bagua {
namespace bindings {
namespace {

Stream stream_of(uintptr_t s) { return reinterpret_cast<Stream>(s); }

std::chrono::milliseconds timeout_of(double seconds) {
  if (!(seconds > 0) || !std::isfinite(seconds)) throw InvalidArgument("timeout_s must be a positive number");
  return std::chrono::milliseconds(static_cast<int64_t>(std::ceil(seconds * 1000.0)));
}

}  // namespace

void bind_device(py::module_& m) {
  py::class_<Device, std::shared_ptr<Device>>(m, "Device", R"doc(
Memory, streams and ordering of one device: ``Device.cuda(index)`` (a GPU), or
``Device.host(delay_us)``, the host implementation whose streams are ordered
queues, each run by its own thread, with ``delay_us`` added before each queued
task (so that a missing wait shows up as a wrong value). Streams are ints.)doc")
      .def_static("cuda", &cuda_device, py::arg("index"))
      .def_static(
          "host", [](int64_t delay_us) { return host_device(std::chrono::microseconds(delay_us)); },
          py::arg("delay_us") = 0)
      .def_property_readonly(
          "type", [](const Device& d) { return d.type() == DeviceType::kCUDA ? "cuda" : "cpu"; },
          "Memory kind: 'cuda', or 'cpu' for the host implementation.")
      .def_property_readonly("index", &Device::index)
      .def("describe", &Device::describe)
      .def(
          "new_stream",
          [](Device& d, std::optional<int64_t> delay_us) {
            Stream s = delay_us ? new_host_stream(d, std::chrono::microseconds(*delay_us)) : d.new_stream();
            return reinterpret_cast<uintptr_t>(s);
          },
          py::arg("delay_us") = py::none(),
          "A new stream of this device (an int handle, valid as long as the device); host devices take a delay "
          "of the stream's own.")
      .def(
          "synchronize",
          [](Device& d, uintptr_t stream, double timeout_s) {
            const auto timeout = timeout_of(timeout_s);
            py::gil_scoped_release release;
            d.synchronize(stream_of(stream), timeout);
          },
          py::arg("stream"), py::arg("timeout_s") = 60.0,
          "Blocks until the stream's work is done; raises its failure, or CommTimeoutError after timeout_s.")
      .def(
          "copy_async",
          [](Device& d, uintptr_t dst, uintptr_t src, size_t nbytes, uintptr_t stream) {
            d.copy_async(reinterpret_cast<void*>(dst), reinterpret_cast<const void*>(src), nbytes, stream_of(stream));
          },
          py::arg("dst"), py::arg("src"), py::arg("nbytes"), py::arg("stream"),
          "Copies nbytes between addresses (any direction) in stream order.")
      .def(
          "write_async",
          [](Device& d, uintptr_t address, py::bytes data, uintptr_t stream) {
            if (!d.host_accessible()) throw InvalidArgument("write_async: host-accessible devices only");
            auto bytes = std::make_shared<std::string>(data);
            void* dst = reinterpret_cast<void*>(address);
            d.enqueue_host(stream_of(stream), [bytes, dst] { std::memcpy(dst, bytes->data(), bytes->size()); });
          },
          py::arg("address"), py::arg("data"), py::arg("stream"),
          "Writes `data` at `address` in stream order (host implementation: a task on the stream's queue).")
      .def("__repr__", [](const Device& d) { return "<Device " + d.describe() + ">"; });
}

}  // namespace bindings
}  // namespace bagua
