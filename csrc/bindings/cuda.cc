// CUDA availability, the NCCL communicator (csrc/comm/nccl/) and the CUDA
// kernels (csrc/kernels/cuda_kernels.cu), plus `_C.raw`: communicator
// operations and kernels on raw addresses (e.g. torch's data_ptr() and
// current stream), for frontends and tests.
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <cctype>
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

ReduceOp to_reduce_op(int code) {
  if (!is_valid_reduce_op(code)) throw InvalidArgument("unknown reduce op code " + std::to_string(code));
  return static_cast<ReduceOp>(code);
}

[[maybe_unused]] std::chrono::milliseconds to_timeout(double seconds) {
  if (!(seconds > 0) || !std::isfinite(seconds)) {
    throw InvalidArgument("timeout must be a positive number of seconds, got " + std::to_string(seconds));
  }
  return std::chrono::milliseconds(static_cast<int64_t>(std::ceil(seconds * 1000.0)));
}

void* as_ptr(uintptr_t address) { return reinterpret_cast<void*>(address); }

// A Python object with set(key, bytes) and get(key) -> bytes, e.g.
// torch.distributed.TCPStore, used as a bagua::Store. Takes the GIL per call.
class PyStore : public Store {
 public:
  PyStore(py::object obj, std::chrono::milliseconds timeout) : obj_(std::move(obj)), timeout_(timeout) {}
  ~PyStore() override {
    py::gil_scoped_acquire gil;
    obj_ = py::object();
  }

  void set(const std::string& key, const std::vector<uint8_t>& value) override {
    call("set", [&] {
      obj_.attr("set")(key, py::bytes(reinterpret_cast<const char*>(value.data()), value.size()));
    }, key);
  }

  std::vector<uint8_t> get(const std::string& key, std::chrono::milliseconds) override {
    std::vector<uint8_t> out;
    call("get", [&] {
      std::string v = obj_.attr("get")(key).cast<std::string>();
      out.assign(v.begin(), v.end());
    }, key);
    return out;
  }

  int64_t add(const std::string& key, int64_t delta) override {
    int64_t out = 0;
    call("add", [&] { out = obj_.attr("add")(key, delta).cast<int64_t>(); }, key);
    return out;
  }

  void wait(const std::vector<std::string>& keys, std::chrono::milliseconds) override {
    call("wait", [&] { obj_.attr("wait")(keys); }, keys.empty() ? std::string() : keys.front());
  }

  bool check(const std::vector<std::string>& keys) override {
    bool out = false;
    call("check", [&] { out = obj_.attr("check")(keys).cast<bool>(); },
         keys.empty() ? std::string() : keys.front());
    return out;
  }

  std::chrono::milliseconds timeout() const override { return timeout_; }

 private:
  template <typename F>
  void call(const char* method, F&& f, const std::string& key) {
    py::gil_scoped_acquire gil;
    try {
      f();
    } catch (py::error_already_set& e) {
      std::string msg = std::string("store.") + method + "('" + key + "') failed: " + e.what();
      std::string lower = msg;
      for (char& c : lower) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
      if (e.matches(PyExc_TimeoutError) || lower.find("timeout") != std::string::npos ||
          lower.find("timed out") != std::string::npos) {
        throw TimeoutError(msg);
      }
      throw Error(msg);
    } catch (py::cast_error& e) {
      throw Error(std::string("store.") + method + "('" + key + "') returned an unexpected type: " + e.what());
    }
  }

  py::object obj_;
  std::chrono::milliseconds timeout_;
};

[[maybe_unused]] StorePtr as_store(py::handle obj, std::chrono::milliseconds timeout) {
  if (py::detail::get_type_info(typeid(Store)) != nullptr) {
    try {
      return obj.cast<StorePtr>();
    } catch (py::cast_error&) {
    }
  }
  if (!obj.is_none() && py::hasattr(obj, "set") && py::hasattr(obj, "get")) {
    return std::make_shared<PyStore>(py::reinterpret_borrow<py::object>(obj), timeout);
  }
  throw py::type_error("store must be a bagua store, or an object with set(key, bytes) and "
                       "get(key) -> bytes such as torch.distributed.TCPStore; got " +
                       std::string(py::str(py::type::handle_of(obj).attr("__name__"))));
}

// comm.cc owns the Python type of bagua::Communicator; until it registers one,
// register a minimal type here so NCCL communicators can reach Python.
void ensure_communicator_type(py::module_& m) {
  if (py::detail::get_type_info(typeid(Communicator)) != nullptr) return;
  py::class_<Communicator, CommunicatorPtr>(m, "Communicator")
      .def_property_readonly("rank", &Communicator::rank)
      .def_property_readonly("size", &Communicator::size)
      .def("describe", &Communicator::describe)
      .def("__repr__", [](const Communicator& c) { return "<Communicator " + c.describe() + ">"; });
}

CommunicatorPtr create_nccl_communicator(py::handle store, const std::string& prefix, int rank,
                                         int size, int device, double timeout_s,
                                         const std::string& library_path, bool native_avg) {
#ifdef BAGUA_WITH_CUDA
  NcclOptions options;
  options.device = device;
  options.timeout = to_timeout(timeout_s);
  options.library_path = library_path;
  options.native_avg = native_avg;
  StorePtr s = as_store(store, options.timeout);  // released below with the GIL held
  py::gil_scoped_release release;
  // The destructor may wait (up to the timeout) for outstanding work: never
  // with the GIL held.
  return CommunicatorPtr(new NcclCommunicator(*s, prefix, rank, size, options), [](Communicator* c) {
    if (PyGILState_Check()) {
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

void bind_raw(py::module_& m) {
  py::module_ raw = m.def_submodule(
      "raw",
      "Communicator operations and kernels on raw addresses (ints) and CUDA streams (ints, "
      "0 = none). The caller keeps the memory alive and synchronizes the stream; see "
      "bagua::Communicator for the meaning of each argument.");
  using Ptr = CommunicatorPtr;
  auto release = py::call_guard<py::gil_scoped_release>();
  raw.def("allreduce", [](const Ptr& c, uintptr_t send, uintptr_t recv, size_t count, int dtype, int op, uintptr_t stream) {
    c->allreduce(as_ptr(send), as_ptr(recv), count, to_dtype(dtype), to_reduce_op(op), as_ptr(stream));
  }, py::arg("comm"), py::arg("send"), py::arg("recv"), py::arg("count"), py::arg("dtype"), py::arg("op"), py::arg("stream") = 0, release);
  raw.def("reduce", [](const Ptr& c, uintptr_t send, uintptr_t recv, size_t count, int dtype, int op, int root, uintptr_t stream) {
    c->reduce(as_ptr(send), as_ptr(recv), count, to_dtype(dtype), to_reduce_op(op), root, as_ptr(stream));
  }, py::arg("comm"), py::arg("send"), py::arg("recv"), py::arg("count"), py::arg("dtype"), py::arg("op"), py::arg("root"), py::arg("stream") = 0, release);
  raw.def("broadcast", [](const Ptr& c, uintptr_t buf, size_t count, int dtype, int root, uintptr_t stream) {
    c->broadcast(as_ptr(buf), count, to_dtype(dtype), root, as_ptr(stream));
  }, py::arg("comm"), py::arg("buf"), py::arg("count"), py::arg("dtype"), py::arg("root"), py::arg("stream") = 0, release);
  raw.def("allgather", [](const Ptr& c, uintptr_t send, uintptr_t recv, size_t count, int dtype, uintptr_t stream) {
    c->allgather(as_ptr(send), as_ptr(recv), count, to_dtype(dtype), as_ptr(stream));
  }, py::arg("comm"), py::arg("send"), py::arg("recv"), py::arg("count"), py::arg("dtype"), py::arg("stream") = 0, release);
  raw.def("gather", [](const Ptr& c, uintptr_t send, uintptr_t recv, size_t count, int dtype, int root, uintptr_t stream) {
    c->gather(as_ptr(send), as_ptr(recv), count, to_dtype(dtype), root, as_ptr(stream));
  }, py::arg("comm"), py::arg("send"), py::arg("recv"), py::arg("count"), py::arg("dtype"), py::arg("root"), py::arg("stream") = 0, release);
  raw.def("scatter", [](const Ptr& c, uintptr_t send, uintptr_t recv, size_t count, int dtype, int root, uintptr_t stream) {
    c->scatter(as_ptr(send), as_ptr(recv), count, to_dtype(dtype), root, as_ptr(stream));
  }, py::arg("comm"), py::arg("send"), py::arg("recv"), py::arg("count"), py::arg("dtype"), py::arg("root"), py::arg("stream") = 0, release);
  raw.def("reduce_scatter", [](const Ptr& c, uintptr_t send, uintptr_t recv, size_t count, int dtype, int op, uintptr_t stream) {
    c->reduce_scatter(as_ptr(send), as_ptr(recv), count, to_dtype(dtype), to_reduce_op(op), as_ptr(stream));
  }, py::arg("comm"), py::arg("send"), py::arg("recv"), py::arg("count"), py::arg("dtype"), py::arg("op"), py::arg("stream") = 0, release);
  raw.def("alltoall", [](const Ptr& c, uintptr_t send, uintptr_t recv, size_t count, int dtype, uintptr_t stream) {
    c->alltoall(as_ptr(send), as_ptr(recv), count, to_dtype(dtype), as_ptr(stream));
  }, py::arg("comm"), py::arg("send"), py::arg("recv"), py::arg("count"), py::arg("dtype"), py::arg("stream") = 0, release);
  raw.def("alltoall_v", [](const Ptr& c, uintptr_t send, const std::vector<size_t>& send_counts, const std::vector<size_t>& send_displs,
                           uintptr_t recv, const std::vector<size_t>& recv_counts, const std::vector<size_t>& recv_displs, int dtype, uintptr_t stream) {
    c->alltoall_v(as_ptr(send), send_counts, send_displs, as_ptr(recv), recv_counts, recv_displs, to_dtype(dtype), as_ptr(stream));
  }, py::arg("comm"), py::arg("send"), py::arg("send_counts"), py::arg("send_displs"), py::arg("recv"), py::arg("recv_counts"),
     py::arg("recv_displs"), py::arg("dtype"), py::arg("stream") = 0, release);
  raw.def("send", [](const Ptr& c, uintptr_t buf, size_t count, int dtype, int peer, uintptr_t stream) {
    c->send(as_ptr(buf), count, to_dtype(dtype), peer, as_ptr(stream));
  }, py::arg("comm"), py::arg("buf"), py::arg("count"), py::arg("dtype"), py::arg("peer"), py::arg("stream") = 0, release);
  raw.def("recv", [](const Ptr& c, uintptr_t buf, size_t count, int dtype, int peer, uintptr_t stream) {
    c->recv(as_ptr(buf), count, to_dtype(dtype), peer, as_ptr(stream));
  }, py::arg("comm"), py::arg("buf"), py::arg("count"), py::arg("dtype"), py::arg("peer"), py::arg("stream") = 0, release);
  raw.def("barrier", [](const Ptr& c, uintptr_t stream) { c->barrier(as_ptr(stream)); },
          py::arg("comm"), py::arg("stream") = 0, release);

  // Element kernels: host loops (any build) and CUDA launches (CUDA builds).
  raw.def("host_scale", [](uintptr_t data, size_t count, int dtype, double factor) {
    scale_host(as_ptr(data), count, to_dtype(dtype), factor);
  }, py::arg("data"), py::arg("count"), py::arg("dtype"), py::arg("factor"), release);
  raw.def("host_divide", [](uintptr_t data, size_t count, int dtype, double divisor) {
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
  raw.def("cuda_scale", [device_of](uintptr_t data, size_t count, int dtype, double factor, uintptr_t stream) {
    DType t = to_dtype(dtype);
    if (count == 0) return;
    cuda::DeviceGuard guard(device_of(data));
    cuda::launch_scale(as_ptr(data), count, t, factor, static_cast<cudaStream_t>(as_ptr(stream)));
  }, py::arg("data"), py::arg("count"), py::arg("dtype"), py::arg("factor"), py::arg("stream") = 0, release);
  raw.def("cuda_divide", [device_of](uintptr_t data, size_t count, int dtype, double divisor, uintptr_t stream) {
    DType t = to_dtype(dtype);
    if (count == 0) return;
    cuda::DeviceGuard guard(device_of(data));
    cuda::launch_divide(as_ptr(data), count, t, divisor, static_cast<cudaStream_t>(as_ptr(stream)));
  }, py::arg("data"), py::arg("count"), py::arg("dtype"), py::arg("divisor"), py::arg("stream") = 0, release);
#else
  raw.def("cuda_scale", [](py::args, py::kwargs) { no_cuda("cuda_scale"); });
  raw.def("cuda_divide", [](py::args, py::kwargs) { no_cuda("cuda_divide"); });
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
  ensure_communicator_type(m);
  m.def("create_nccl_communicator", &create_nccl_communicator, py::arg("store"), py::arg("prefix"),
        py::arg("rank"), py::arg("size"), py::arg("device"), py::arg("timeout_s"),
        py::arg("library_path"), py::arg("native_avg") = true,
        "Creates an NCCL communicator (collective over the group; see "
        "csrc/comm/nccl/nccl_communicator.h). store: a bagua store, or any object with "
        "set(key, bytes) / get(key) -> bytes such as torch.distributed.TCPStore.");
  bind_raw(m);
}

}  // namespace bindings
}  // namespace bagua
