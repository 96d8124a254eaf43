// CUDA availability and the NCCL communicator (csrc/comm/nccl/).
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <chrono>
#include <cmath>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "bindings/bindings.h"
#include "comm/communicator.h"
#include "common/error.h"
#include "store/store.h"

#ifdef BAGUA_WITH_CUDA
#include "comm/nccl/cuda_util.h"
#include "comm/nccl/nccl_communicator.h"
#include "comm/nccl/nccl_library.h"
#endif

namespace py = pybind11;

namespace bagua {
namespace bindings {
namespace {

[[noreturn, maybe_unused]] void no_cuda(const char* what) {
  throw Error(std::string(what) +
              ": bagua_core was built without CUDA (no CUDA toolkit was found at build time); "
              "rebuild it on a machine with nvcc to use NCCL");
}

[[maybe_unused]] std::chrono::milliseconds to_timeout(double seconds) {
  if (!(seconds > 0) || !std::isfinite(seconds)) {
    throw InvalidArgument("timeout must be a positive number of seconds, got " + std::to_string(seconds));
  }
  return std::chrono::milliseconds(static_cast<int64_t>(std::ceil(seconds * 1000.0)));
}

CommunicatorPtr create_nccl_communicator(const StorePtr& store, const std::string& prefix, int rank, int size,
                                         int device, double timeout_s, const std::string& library_path,
                                         bool native_avg) {
#ifdef BAGUA_WITH_CUDA
  if (!store) throw InvalidArgument("store must not be None");
  NcclOptions options;
  options.device = device;
  options.timeout = to_timeout(timeout_s);
  options.library_path = library_path;
  options.native_avg = native_avg;
  // The destructor may wait (up to the timeout) for outstanding work: never
  // with the GIL held.
  return CommunicatorPtr(new NcclCommunicator(*store, prefix, rank, size, options), [](Communicator* c) {
    if (Py_IsInitialized() && PyGILState_Check()) {
      py::gil_scoped_release unlocked;
      delete c;
    } else {
      delete c;
    }
  });
#else
  no_cuda("create_nccl_communicator");
#endif
}

}  // namespace

void bind_cuda(py::module_& m) {
#ifdef BAGUA_WITH_CUDA
  m.attr("built_with_cuda") = true;
  m.def("cuda_device_count", &cuda::device_count, "Number of visible CUDA devices; 0 without a GPU or a driver.");
  m.def("cuda_driver_version", &cuda::driver_version, "CUDA driver version (e.g. 13000); 0 without a driver.");
  m.def("cuda_runtime_version", &cuda::runtime_version, "CUDA runtime version the module was built with (e.g. 13000).");
  m.def("cuda_unavailable_reason", &cuda::no_device_reason, "Why cuda_device_count() is 0, in words.");
  m.def("nccl_version", &nccl::query_version, py::arg("library_path"),
        "ncclGetVersion of the NCCL library at this path (e.g. 22907 for 2.29.7).");
  m.def(
      "nccl_check_library", [](const std::string& path) { return nccl::load_library(path)->version; },
      py::arg("library_path"),
      "Loads the NCCL library as a communicator would (every symbol, minimum version) and "
      "returns its version; raises BaguaError naming what is wrong.");
#else
  m.attr("built_with_cuda") = false;
  m.def("cuda_device_count", [] { return 0; });
  m.def("cuda_driver_version", [] { return 0; });
  m.def("cuda_runtime_version", [] { return 0; });
  m.def("cuda_unavailable_reason", [] { return std::string("bagua_core was built without CUDA"); });
  m.def("nccl_version", [](const std::string&) -> int { no_cuda("nccl_version"); }, py::arg("library_path"));
  m.def(
      "nccl_check_library", [](const std::string&) -> int { no_cuda("nccl_check_library"); }, py::arg("library_path"));
#endif
  m.def("create_nccl_communicator", &create_nccl_communicator, py::arg("store"), py::arg("prefix"), py::arg("rank"),
        py::arg("size"), py::arg("device"), py::arg("timeout_s"), py::arg("library_path"), py::arg("native_avg") = true,
        py::call_guard<py::gil_scoped_release>(),
        "Creates an NCCL communicator on CUDA device `device`; every rank of group `prefix` "
        "calls it (rank 0 publishes NCCL's id in `store`). Operations enqueue on the stream "
        "passed to them and return; the caller synchronizes that stream (stream 0: the "
        "communicator's own stream, and the call waits). `native_avg=False` computes AVG as "
        "SUM + a divide kernel. See csrc/comm/nccl/nccl_communicator.h.");
}

}  // namespace bindings
}  // namespace bagua
