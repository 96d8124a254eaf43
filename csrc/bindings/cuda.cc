// CUDA availability, the NCCL communicator (csrc/comm/nccl/) and, in
// `_C.kernels`, the element kernels on raw addresses (CUDA launches and the
// host loops over the same element functions).
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
#include "kernels/scale.h"
#include "store/store.h"

#ifdef BAGUA_WITH_CUDA
#include "comm/nccl/cuda_util.h"
#include "comm/nccl/nccl_communicator.h"
#include "comm/nccl/nccl_library.h"
#include "kernels/cuda_kernels.h"
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

DType to_dtype(int code) {
  if (!is_valid_dtype(code)) throw InvalidArgument("unknown dtype code " + std::to_string(code));
  return static_cast<DType>(code);
}

[[maybe_unused]] std::chrono::milliseconds to_timeout(double seconds) {
  if (!(seconds > 0) || !std::isfinite(seconds)) {
    throw InvalidArgument("timeout must be a positive number of seconds, got " + std::to_string(seconds));
  }
  return std::chrono::milliseconds(static_cast<int64_t>(std::ceil(seconds * 1000.0)));
}

void* as_ptr(uintptr_t address) { return reinterpret_cast<void*>(address); }

CommunicatorPtr create_nccl_communicator(const StorePtr& store, const std::string& prefix, int rank,
                                         int size, int device, double timeout_s,
                                         const std::string& library_path, bool native_avg) {
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

void bind_kernels(py::module_& m) {
  py::module_ k = m.def_submodule(
      "kernels",
      "Element kernels on raw addresses (ints) with a count and a dtype code: host loops, and "
      "CUDA launches on a stream (int, 0 = the legacy default stream) that the caller "
      "synchronizes. The same element functions run on both (kernels/scale.h).");
  auto release = py::call_guard<py::gil_scoped_release>();
  k.def("host_scale", [](uintptr_t data, size_t count, int dtype, double factor) {
    scale_host(as_ptr(data), count, to_dtype(dtype), factor);
  }, py::arg("data"), py::arg("count"), py::arg("dtype"), py::arg("factor"), release);
  k.def("host_divide", [](uintptr_t data, size_t count, int dtype, double divisor) {
    divide_host(as_ptr(data), count, to_dtype(dtype), divisor);
  }, py::arg("data"), py::arg("count"), py::arg("dtype"), py::arg("divisor"), release);
#ifdef BAGUA_WITH_CUDA
  // The kernel runs on the device that holds `data` (else the current one).
  auto device_of = [](uintptr_t data) {
    cudaPointerAttributes attr;
    cudaError_t err = cudaPointerGetAttributes(&attr, as_ptr(data));
    if (err != cudaSuccess) {
      cudaGetLastError();
      int current = 0;
      cuda::check(cudaGetDevice(&current), "cudaGetDevice");
      return current;
    }
    if (attr.type != cudaMemoryTypeDevice && attr.type != cudaMemoryTypeManaged) {
      throw InvalidArgument("the kernel needs device memory, got a host pointer");
    }
    return attr.device;
  };
  k.def("cuda_scale", [device_of](uintptr_t data, size_t count, int dtype, double factor, uintptr_t stream) {
    DType t = to_dtype(dtype);
    if (count == 0) return;
    cuda::DeviceGuard guard(device_of(data));
    cuda::launch_scale(as_ptr(data), count, t, factor, static_cast<cudaStream_t>(as_ptr(stream)));
  }, py::arg("data"), py::arg("count"), py::arg("dtype"), py::arg("factor"), py::arg("stream") = 0, release);
  k.def("cuda_divide", [device_of](uintptr_t data, size_t count, int dtype, double divisor, uintptr_t stream) {
    DType t = to_dtype(dtype);
    if (count == 0) return;
    cuda::DeviceGuard guard(device_of(data));
    cuda::launch_divide(as_ptr(data), count, t, divisor, static_cast<cudaStream_t>(as_ptr(stream)));
  }, py::arg("data"), py::arg("count"), py::arg("dtype"), py::arg("divisor"), py::arg("stream") = 0, release);
#else
  k.def("cuda_scale", [](py::args, py::kwargs) { no_cuda("cuda_scale"); });
  k.def("cuda_divide", [](py::args, py::kwargs) { no_cuda("cuda_divide"); });
#endif
}

}  // namespace

void bind_cuda(py::module_& m) {
#ifdef BAGUA_WITH_CUDA
  m.attr("built_with_cuda") = true;
  m.def("cuda_device_count", &cuda::device_count,
        "Number of visible CUDA devices; 0 without a GPU or a driver.");
  m.def("cuda_driver_version", &cuda::driver_version,
        "CUDA driver version (e.g. 13000); 0 without a driver.");
  m.def("cuda_runtime_version", &cuda::runtime_version,
        "CUDA runtime version the module was built with (e.g. 13000).");
  m.def("cuda_unavailable_reason", &cuda::no_device_reason,
        "Why cuda_device_count() is 0, in words.");
  m.def("nccl_version", &nccl::query_version, py::arg("library_path"),
        "ncclGetVersion of the NCCL library at this path (e.g. 22907 for 2.29.7).");
  m.def("nccl_check_library", [](const std::string& path) { return nccl::load_library(path)->version; },
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
  m.def("nccl_check_library", [](const std::string&) -> int { no_cuda("nccl_check_library"); },
        py::arg("library_path"));
#endif
  m.def("create_nccl_communicator", &create_nccl_communicator, py::arg("store"), py::arg("prefix"),
        py::arg("rank"), py::arg("size"), py::arg("device"), py::arg("timeout_s"),
        py::arg("library_path"), py::arg("native_avg") = true,
        py::call_guard<py::gil_scoped_release>(),
        "Creates an NCCL communicator on CUDA device `device`; every rank of group `prefix` "
        "calls it (rank 0 publishes NCCL's id in `store`). Operations enqueue on the stream "
        "passed to them and return; the caller synchronizes that stream (stream 0: the "
        "communicator's own stream, and the call waits). `native_avg=False` computes AVG as "
        "SUM + a divide kernel. See csrc/comm/nccl/nccl_communicator.h.");
  bind_kernels(m);
}

}  // namespace bindings
}  // namespace bagua
