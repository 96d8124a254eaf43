// Communicators for Python: raw addresses (ints) in, so that the Python layer
// can hand over any DLPack array's data pointer. Every operation releases the
// GIL while it runs.
#include <pybind11/functional.h>
#include <pybind11/stl.h>

#include <chrono>
#include <cmath>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "bindings/bindings.h"
#include "comm/agreed_communicator.h"
#include "comm/checked_communicator.h"
#include "comm/staged_communicator.h"
#include "comm/communicator.h"
#include "comm/gloo/packed_allreduce.h"
#include "comm/gloo/communicator.h"
#include "comm/registry.h"
#include "comm/shm/host_identity.h"
#include "common/error.h"
#include "store/store.h"

namespace py = pybind11;

namespace bagua {
namespace bindings {
namespace {

using Release = py::call_guard<py::gil_scoped_release>;

const void* cptr(uintptr_t p) { return reinterpret_cast<const void*>(p); }
void* mptr(uintptr_t p) { return reinterpret_cast<void*>(p); }
Stream sptr(uintptr_t p) { return reinterpret_cast<Stream>(p); }

WirePacking to_wire_packing(const std::string& v) {
  for (WirePacking w : {WirePacking::kOff, WirePacking::kAuto, WirePacking::kOn})
    if (v == wire_packing_name(w)) return w;
  throw InvalidArgument("wire_packing must be 'auto', 'on' or 'off', got '" + v + "'");
}

ReduceOp to_op(int v) {
  if (!is_valid_reduce_op(v)) throw InvalidArgument("unknown reduce op code " + std::to_string(v));
  return static_cast<ReduceOp>(v);
}

size_t to_count(int64_t v, const char* what) {
  if (v < 0) throw InvalidArgument(std::string(what) + " must be >= 0, got " + std::to_string(v));
  return static_cast<size_t>(v);
}

std::vector<size_t> to_counts(const std::vector<int64_t>& v, const char* what) {
  std::vector<size_t> out;
  out.reserve(v.size());
  for (int64_t x : v) out.push_back(to_count(x, what));
  return out;
}

std::chrono::milliseconds to_timeout(double seconds) {
  if (!(seconds > 0) || !std::isfinite(seconds))
    throw InvalidArgument("timeout_s must be a positive number of seconds");
  return std::chrono::milliseconds(static_cast<int64_t>(std::ceil(seconds * 1000.0)));
}

}  // namespace

void bind_comm(py::module_& m) {
  py::class_<Communicator, CommunicatorPtr>(m, "Communicator", R"doc(
A process group's communicator. Buffers are passed as integer addresses with an
element count and a dtype code (bagua DType); every call blocks until done and
releases the GIL while it runs. Where an operation has one chunk per rank,
``count`` is the size of one chunk.)doc")
      .def_property_readonly("rank", &Communicator::rank)
      .def_property_readonly("size", &Communicator::size)
      .def_property_readonly("timeout_s", [](const Communicator& c) { return c.timeout().count() / 1000.0; })
      .def_property_readonly("device_type", [](const Communicator& c) { return static_cast<int>(c.device_type()); })
      .def_property_readonly(
          "device_index",
          [](const Communicator& c) -> py::object {
            const int d = c.device_index();
            return d < 0 ? py::object(py::none()) : py::object(py::int_(d));
          },
          "CUDA device index of a device communicator (NCCL); None on host ones.")
      .def("describe", &Communicator::describe)
      .def("close", &Communicator::close, py::call_guard<py::gil_scoped_release>(),
           "Releases connections and threads now (after the operation in progress); later calls raise. "
           "Idempotent.")
      .def("__repr__", [](const Communicator& c) { return "<Communicator " + c.describe() + ">"; })
      .def(
          "allreduce",
          [](Communicator& c, uintptr_t send, uintptr_t recv, int64_t count, int dtype, int op, uintptr_t stream) {
            c.allreduce(cptr(send), mptr(recv), to_count(count, "count"), to_dtype(dtype), to_op(op), sptr(stream));
          },
          py::arg("send_ptr"), py::arg("recv_ptr"), py::arg("count"), py::arg("dtype"), py::arg("op"),
          py::arg("stream") = 0, Release())
      .def(
          "reduce",
          [](Communicator& c, uintptr_t send, uintptr_t recv, int64_t count, int dtype, int op, int root,
             uintptr_t stream) {
            c.reduce(cptr(send), mptr(recv), to_count(count, "count"), to_dtype(dtype), to_op(op), root, sptr(stream));
          },
          py::arg("send_ptr"), py::arg("recv_ptr"), py::arg("count"), py::arg("dtype"), py::arg("op"), py::arg("root"),
          py::arg("stream") = 0, Release())
      .def(
          "broadcast",
          [](Communicator& c, uintptr_t buf, int64_t count, int dtype, int root, uintptr_t stream) {
            c.broadcast(mptr(buf), to_count(count, "count"), to_dtype(dtype), root, sptr(stream));
          },
          py::arg("ptr"), py::arg("count"), py::arg("dtype"), py::arg("root"), py::arg("stream") = 0, Release())
      .def(
          "allgather",
          [](Communicator& c, uintptr_t send, uintptr_t recv, int64_t count, int dtype, uintptr_t stream) {
            c.allgather(cptr(send), mptr(recv), to_count(count, "count"), to_dtype(dtype), sptr(stream));
          },
          py::arg("send_ptr"), py::arg("recv_ptr"), py::arg("count"), py::arg("dtype"), py::arg("stream") = 0,
          Release())
      .def(
          "gather",
          [](Communicator& c, uintptr_t send, uintptr_t recv, int64_t count, int dtype, int root, uintptr_t stream) {
            c.gather(cptr(send), mptr(recv), to_count(count, "count"), to_dtype(dtype), root, sptr(stream));
          },
          py::arg("send_ptr"), py::arg("recv_ptr"), py::arg("count"), py::arg("dtype"), py::arg("root"),
          py::arg("stream") = 0, Release())
      .def(
          "scatter",
          [](Communicator& c, uintptr_t send, uintptr_t recv, int64_t count, int dtype, int root, uintptr_t stream) {
            c.scatter(cptr(send), mptr(recv), to_count(count, "count"), to_dtype(dtype), root, sptr(stream));
          },
          py::arg("send_ptr"), py::arg("recv_ptr"), py::arg("count"), py::arg("dtype"), py::arg("root"),
          py::arg("stream") = 0, Release())
      .def(
          "reduce_scatter",
          [](Communicator& c, uintptr_t send, uintptr_t recv, int64_t count, int dtype, int op, uintptr_t stream) {
            c.reduce_scatter(cptr(send), mptr(recv), to_count(count, "count"), to_dtype(dtype), to_op(op),
                             sptr(stream));
          },
          py::arg("send_ptr"), py::arg("recv_ptr"), py::arg("count"), py::arg("dtype"), py::arg("op"),
          py::arg("stream") = 0, Release())
      .def(
          "alltoall",
          [](Communicator& c, uintptr_t send, uintptr_t recv, int64_t count, int dtype, uintptr_t stream) {
            c.alltoall(cptr(send), mptr(recv), to_count(count, "count"), to_dtype(dtype), sptr(stream));
          },
          py::arg("send_ptr"), py::arg("recv_ptr"), py::arg("count"), py::arg("dtype"), py::arg("stream") = 0,
          Release())
      .def(
          "alltoall_v",
          [](Communicator& c, uintptr_t send, const std::vector<int64_t>& send_counts,
             const std::vector<int64_t>& send_displs, uintptr_t recv, const std::vector<int64_t>& recv_counts,
             const std::vector<int64_t>& recv_displs, int dtype, uintptr_t stream) {
            c.alltoall_v(cptr(send), to_counts(send_counts, "send_counts"), to_counts(send_displs, "send_displs"),
                         mptr(recv), to_counts(recv_counts, "recv_counts"), to_counts(recv_displs, "recv_displs"),
                         to_dtype(dtype), sptr(stream));
          },
          py::arg("send_ptr"), py::arg("send_counts"), py::arg("send_displs"), py::arg("recv_ptr"),
          py::arg("recv_counts"), py::arg("recv_displs"), py::arg("dtype"), py::arg("stream") = 0, Release())
      .def(
          "send",
          [](Communicator& c, uintptr_t buf, int64_t count, int dtype, int peer, uintptr_t stream) {
            c.send(cptr(buf), to_count(count, "count"), to_dtype(dtype), peer, sptr(stream));
          },
          py::arg("ptr"), py::arg("count"), py::arg("dtype"), py::arg("peer"), py::arg("stream") = 0, Release())
      .def(
          "recv",
          [](Communicator& c, uintptr_t buf, int64_t count, int dtype, int peer, uintptr_t stream) {
            c.recv(mptr(buf), to_count(count, "count"), to_dtype(dtype), peer, sptr(stream));
          },
          py::arg("ptr"), py::arg("count"), py::arg("dtype"), py::arg("peer"), py::arg("stream") = 0, Release())
      .def(
          "barrier", [](Communicator& c, uintptr_t stream) { c.barrier(sptr(stream)); }, py::arg("stream") = 0,
          Release())
      .def(
          "_expect_calls",
          [](Communicator& c, const std::vector<std::tuple<int, int, int64_t, int64_t, int>>& calls) {
            std::vector<OpDesc> descs;
            for (const auto& [kind, dtype, count, root, op] : calls) {
              if (kind < 1 || kind > static_cast<int>(OpKind::kBarrier))
                throw InvalidArgument("_expect_calls: unknown operation kind " + std::to_string(kind));
              descs.push_back(OpDesc{static_cast<OpKind>(kind), to_dtype(dtype), count, root, to_op(op)});
            }
            c.expect_calls(descs);
          },
          py::arg("calls"), Release(),
          "Communicator::expect_calls for tests: (kind, dtype, count, root, op) codes per call "
          "(kind as in comm/op_desc.h: allreduce 1, broadcast 3).");

  m.def(
      "create_gloo_communicator",
      [](StorePtr store, const std::string& prefix, int rank, int size, double timeout_s, const std::string& hostname,
         bool debug_checks, std::optional<bool> shm, const std::string& wire_packing) {
        GlooCommunicatorOptions o;
        o.timeout = to_timeout(timeout_s);
        o.hostname = hostname;
        if (shm) o.shm = *shm;
        if (!wire_packing.empty()) o.wire_packing = to_wire_packing(wire_packing);
        CommunicatorPtr comm = create_gloo_communicator(std::move(store), prefix, rank, size, o);
        return debug_checks ? make_checked_communicator(comm) : comm;
      },
      py::arg("store"), py::arg("prefix"), py::arg("rank"), py::arg("size"), py::arg("timeout_s"), py::arg("hostname"),
      py::arg("debug_checks") = false, py::arg("shm") = py::none(), py::arg("wire_packing") = "", Release(),
      R"doc(Connects this process to the other ranks of group ``prefix`` (a full mesh of
TCP connections, rendezvoused through ``store``); every rank calls it with the
same prefix and size. ``hostname`` is the address peers reach this process on.
``debug_checks`` wraps the communicator in cross-rank agreement checks
(BAGUA_DEBUG_CHECKS). ``shm`` False keeps allreduce on TCP even when the whole
group is on one host (BAGUA_SHM); None: the communicator's default. ``wire_packing``
is 'auto', 'on' or 'off' (BAGUA_WIRE_PACKING; empty: the engine's default).)doc");

  m.def(
      "wire_packing_totals",
      [] {
        const auto t = gloo_algorithms::packed_allreduce_totals();
        return py::dict(py::arg("packed_messages") = t.packed_messages, py::arg("raw_messages") = t.raw_messages,
                        py::arg("wire_bytes") = t.wire_bytes, py::arg("raw_bytes") = t.raw_bytes,
                        py::arg("received_bytes") = t.received_bytes);
      },
      "Totals over this process's packed-path allreduces (BAGUA_WIRE_PACKING): messages sent packed and "
      "raw, bytes sent, bytes they would have been unpacked, bytes received.");

  // Tuning knobs, for benchmarks (see GlooCommunicatorOptions); None: the default.
  m.def(
      "_create_gloo_communicator_tuned",
      [](StorePtr store, const std::string& prefix, int rank, int size, double timeout_s, const std::string& hostname,
         std::optional<int> lanes, std::optional<int64_t> lane_threshold_bytes, std::optional<int64_t> segment_bytes,
         std::optional<bool> shm, std::optional<int64_t> shm_threshold_bytes, std::optional<int64_t> shm_window_bytes,
         std::optional<std::string> wire_packing, std::optional<int64_t> wire_packing_min_bytes,
         std::optional<int64_t> wire_packing_segment_bytes, std::optional<double> wire_packing_slow_bits_per_s,
         std::optional<int64_t> wire_packing_window_bytes) {
        GlooCommunicatorOptions o;
        o.timeout = to_timeout(timeout_s);
        o.hostname = hostname;
        if (lanes) o.lanes = *lanes;
        if (lane_threshold_bytes) o.lane_threshold_bytes = to_count(*lane_threshold_bytes, "lane_threshold_bytes");
        if (segment_bytes) o.segment_bytes = to_count(*segment_bytes, "segment_bytes");
        if (shm) o.shm = *shm;
        if (shm_threshold_bytes) o.shm_threshold_bytes = to_count(*shm_threshold_bytes, "shm_threshold_bytes");
        if (shm_window_bytes) o.shm_window_bytes = to_count(*shm_window_bytes, "shm_window_bytes");
        if (wire_packing) o.wire_packing = to_wire_packing(*wire_packing);
        if (wire_packing_min_bytes)
          o.wire_packing_min_bytes = to_count(*wire_packing_min_bytes, "wire_packing_min_bytes");
        if (wire_packing_segment_bytes)
          o.wire_packing_segment_bytes = to_count(*wire_packing_segment_bytes, "wire_packing_segment_bytes");
        if (wire_packing_slow_bits_per_s) o.wire_packing_slow_bits_per_s = *wire_packing_slow_bits_per_s;
        if (wire_packing_window_bytes)
          o.wire_packing_window_bytes = to_count(*wire_packing_window_bytes, "wire_packing_window_bytes");
        return create_gloo_communicator(std::move(store), prefix, rank, size, o);
      },
      py::arg("store"), py::arg("prefix"), py::arg("rank"), py::arg("size"), py::arg("timeout_s"), py::arg("hostname"),
      py::arg("lanes") = py::none(), py::arg("lane_threshold_bytes") = py::none(),
      py::arg("segment_bytes") = py::none(), py::arg("shm") = py::none(), py::arg("shm_threshold_bytes") = py::none(),
      py::arg("shm_window_bytes") = py::none(), py::arg("wire_packing") = py::none(),
      py::arg("wire_packing_min_bytes") = py::none(), py::arg("wire_packing_segment_bytes") = py::none(),
      py::arg("wire_packing_slow_bits_per_s") = py::none(), py::arg("wire_packing_window_bytes") = py::none(),
      Release());

#ifdef BAGUA_WITH_TEST_BINDINGS
  m.def("_shm_host_identity", &shm_host_identity,
        "For tests: the key two processes must share for a shared-memory allreduce (comm/shm/host_identity.h).");
#endif
  m.def("stage_through_host", &make_staged_communicator, py::arg("comm"), py::arg("device"),
        "A host communicator (Gloo) serving `device`'s buffers in the order of the call's stream "
        "(comm/staged_communicator.h).");
  m.def("agree_over_control", &make_agreed_communicator, py::arg("comm"), py::arg("control"),
        "`comm` whose collectives the ranks first agree on over `control`, a host communicator over "
        "the same ranks (comm/agreed_communicator.h); closing it closes both.");
  m.def(
      "_agreement_allgather",
      [](Communicator& c, uintptr_t words, int64_t n, uintptr_t all) {
        c.agreement_allgather(reinterpret_cast<const int64_t*>(words), to_count(n, "n"),
                              reinterpret_cast<int64_t*>(all));
      },
      py::arg("comm"), py::arg("words_ptr"), py::arg("n"), py::arg("all_ptr"), Release(),
      "For tests and benchmarks: Communicator::agreement_allgather of n int64 words (host memory).");
  m.def("wrap_debug_checks", &make_checked_communicator, py::arg("comm"),
        "Wraps a communicator in cross-rank agreement checks (raises MismatchError).");
  m.def("register_communicator", &register_communicator, py::arg("comm"),
        "Registers a communicator in the process-wide table; returns its handle.");
  m.def("unregister_communicator", &unregister_communicator, py::arg("handle"));
}

}  // namespace bindings
}  // namespace bagua
