// The overlap engine: bucket plans, buckets with zero-copy slot views, the
// engine (scheduler + comm thread) and its ops. Blocking calls release the GIL;
// the comm thread never takes it.
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <chrono>
#include <cmath>
#include <memory>
#include <optional>
#include <string>
#include <tuple>
#include <vector>

#include "bindings/bindings.h"
#include "bindings/dlpack_capsule.h"
#include "bucket/bucket.h"
#include "bucket/plan.h"
#include "comm/communicator.h"
#include "device/device.h"
#include "ops/async_model_average.h"
#include "ops/decentralized.h"
#include "ops/registry.h"
#include "sched/async_averager.h"
#include "sched/async_weights.h"
#include "sched/engine.h"
#include "sched/bucket_step_op.h"

namespace py = pybind11;

namespace bagua {
namespace bindings {
namespace {

// A typed window on engine memory (a bucket, one of its slots, or a peer
// buffer), exported zero-copy through DLPack (and __array_interface__ for
// numpy). Views and their exports keep the memory alive.
struct MemoryView {
  std::shared_ptr<void> owner;
  void* data;
  std::vector<int64_t> shape;
  DType dtype;
  DLDevice device{kDLCPU, 0};  // kDLCUDA for memory of a CUDA Device

  size_t numel() const {
    size_t n = 1;
    for (int64_t d : shape) n *= static_cast<size_t>(d);
    return n;
  }
};

const char* typestr(DType t) {
  switch (t) {
    case DType::kFloat32: return "<f4";
    case DType::kFloat64: return "<f8";
    case DType::kFloat16: return "<f2";
    case DType::kBFloat16: return "<u2";  // numpy has no bfloat16: the raw bits
    case DType::kInt32: return "<i4";
    case DType::kInt64: return "<i8";
    case DType::kUInt8: return "|u1";
  }
  return "|V1";
}

py::dict array_interface(const MemoryView& v) {
  if (v.device.device_type != kDLCPU)
    throw py::attribute_error("__array_interface__: the memory is on a CUDA device (use DLPack)");
  py::dict d;
  py::tuple shape(v.shape.size());
  for (size_t i = 0; i < v.shape.size(); ++i) shape[i] = py::int_(v.shape[i]);
  d["shape"] = shape;
  d["typestr"] = typestr(v.dtype);
  d["data"] = py::make_tuple(reinterpret_cast<uintptr_t>(v.data), false);
  d["version"] = 3;
  return d;
}

// DLPack export, views only (the point is sharing memory). The consumer's
// stream is not waited on: the engine's wait() orders its work before the
// framework's stream.
py::object export_view(const MemoryView& v, py::object stream, py::object max_version, py::object dl_device,
                       py::object copy) {
  const DLDevice dev = v.device;
  check_requested_device(dl_device, dev, "engine memory");
  if (copy_requested(copy)) raise_buffer_error("engine memory is exported as views only (copy=True is not supported)");
  return make_dlpack_capsule(ExportSpec{v.owner, v.data, v.shape, v.dtype, dev, false, false}, max_version);
}

DLDevice dl_device_of(const Bucket& b) {
  if (b.device_type() == DeviceType::kCUDA) return DLDevice{kDLCUDA, b.device_index()};
  return DLDevice{kDLCPU, 0};
}

MemoryView slot_view(const BucketPtr& b, size_t i) {
  const Slot& s = b->slot(i);
  return MemoryView{b->memory(), b->slot_data(i), s.shape, b->dtype(), dl_device_of(*b)};
}

MemoryView bucket_view(const BucketPtr& b) {
  return MemoryView{b->memory(), b->data(), {static_cast<int64_t>(b->numel())}, b->dtype(), dl_device_of(*b)};
}

// Python's stream handle (an int: cudaStream_t, or a host device's queue; None: no stream).
std::optional<Stream> stream_arg(const std::optional<uintptr_t>& s) {
  if (!s) return std::nullopt;
  return reinterpret_cast<Stream>(*s);
}

size_t slot_index(const Bucket& b, const py::handle& key) {
  if (py::isinstance<py::str>(key)) {
    const std::string name = key.cast<std::string>();
    int64_t i = b.find_slot(name);
    if (i < 0) throw InvalidArgument("bucket '" + b.name() + "' has no tensor named '" + name + "'");
    return static_cast<size_t>(i);
  }
  int64_t i = key.cast<int64_t>();
  if (i < 0 || static_cast<size_t>(i) >= b.num_slots())
    throw InvalidArgument("bucket '" + b.name() + "' has " + std::to_string(b.num_slots()) + " slots, no slot " +
                          std::to_string(i));
  return static_cast<size_t>(i);
}

int dtype_code(DType t) { return static_cast<int>(t); }

py::tuple timing_tuple(const BucketTiming& t) { return py::make_tuple(t.ready_ns, t.launch_ns, t.start_ns, t.end_ns); }

using LaneComms = std::tuple<CommunicatorPtr, CommunicatorPtr, CommunicatorPtr>;  // global, intra, inter

CommSet make_comms(CommunicatorPtr global, CommunicatorPtr intra, CommunicatorPtr inter) {
  if (!global) throw InvalidArgument("Engine: comm is required");
  return CommSet{std::move(global), std::move(intra), std::move(inter)};
}

// A Python dict of hyperparameters (bool, int or str values) as StepParams.
StepParams step_params(const std::string& name, const py::dict& params) {
  StepParams out;
  for (const auto& item : params) {
    const std::string key = py::str(item.first);
    const py::handle v = item.second;
    if (py::isinstance<py::bool_>(v)) {
      out.set(key, v.cast<bool>());
    } else if (py::isinstance<py::int_>(v)) {
      out.set(key, v.cast<int64_t>());
    } else if (py::isinstance<py::str>(v)) {
      out.set(key, v.cast<std::string>());
    } else {
      throw py::type_error(name + ": parameter " + key + " must be a bool, int or str, got " +
                           std::string(py::str(py::type::of(v).attr("__name__"))));
    }
  }
  return out;
}

// The bucket's tensors (padding excluded) as a step sees them (ops/algorithm_step.h).
BucketLayout bucket_layout(const Bucket& b) {
  BucketLayout out;
  for (const Slot& s : b.slots())
    if (!s.is_padding) out.push_back(TensorLayout{s.offset, s.numel, s.shape});
  return out;
}

// Tensors of these shapes back to back from element 0.
BucketLayout consecutive_layout(const std::vector<std::vector<int64_t>>& shapes) {
  BucketLayout out;
  size_t offset = 0;
  for (const auto& shape : shapes) {
    int64_t numel = 1;
    for (int64_t d : shape) {
      if (d < 0) throw InvalidArgument("a tensor shape has a negative dimension");
      numel *= d;
    }
    out.push_back(TensorLayout{offset, static_cast<size_t>(numel), shape});
    offset += static_cast<size_t>(numel);
  }
  return out;
}

}  // namespace

void bind_engine(py::module_& m) {
  m.def("monotonic_ns", &monotonic_ns, "The engine's clock (CLOCK_MONOTONIC, as time.monotonic_ns()).");

  m.def(
      "plan_buckets",
      [](const std::vector<std::tuple<std::string, size_t, int>>& tensors, size_t bucket_bytes) {
        std::vector<TensorDecl> decls;
        decls.reserve(tensors.size());
        for (const auto& t : tensors)
          decls.push_back(TensorDecl{std::get<0>(t), std::get<1>(t), to_dtype(std::get<2>(t))});
        return plan_buckets(decls, bucket_bytes);
      },
      py::arg("tensors"), py::arg("bucket_bytes"),
      "Groups (name, numel, dtype code) declarations, in registration order, into buckets of at most "
      "bucket_bytes (one dtype each); returns lists of indices into tensors, in launch order.");

  m.def("shift_one_peer", &shift_one_peer, py::arg("rank"), py::arg("n"), py::arg("comm_step"),
        "The decentralized shift_one partner of rank among n (even) peers at communication comm_step.");

  py::class_<MemoryView>(m, "MemoryView", R"doc(
Engine memory (a bucket, one of its tensors, or a peer buffer), viewed zero-copy
through DLPack (``torch.from_dlpack(view)``, ``jax.numpy.from_dlpack(view)``,
``numpy.from_dlpack(view)``), ``numpy.asarray(view)`` (``__array_interface__``;
bfloat16 shows as uint16 bits) or by address. Views and their exports keep the
memory alive.)doc")
      .def("__dlpack__", &export_view, py::kw_only(), py::arg("stream") = py::none(),
           py::arg("max_version") = py::none(), py::arg("dl_device") = py::none(), py::arg("copy") = py::none())
      .def("__dlpack_device__",
           [](const MemoryView& v) {
             return py::make_tuple(static_cast<int>(v.device.device_type), v.device.device_id);
           })
      .def_property_readonly("address", [](const MemoryView& v) { return reinterpret_cast<uintptr_t>(v.data); })
      .def_property_readonly("shape", [](const MemoryView& v) { return v.shape; })
      .def_property_readonly(
          "dtype", [](const MemoryView& v) { return dtype_code(v.dtype); }, "DType code.")
      .def_property_readonly("numel", &MemoryView::numel)
      .def_property_readonly("nbytes", [](const MemoryView& v) { return v.numel() * dtype_size(v.dtype); })
      .def_property_readonly("__array_interface__", &array_interface)
      .def("__repr__", [](const MemoryView& v) {
        std::string s = "MemoryView(shape=(";
        for (size_t i = 0; i < v.shape.size(); ++i) s += (i ? ", " : "") + std::to_string(v.shape[i]);
        if (v.shape.size() == 1) s += ",";
        return s + "), dtype=" + dtype_name(v.dtype) + ")";
      });

  py::class_<Bucket, std::shared_ptr<Bucket>>(m, "Bucket", R"doc(
A flat, zero-initialised buffer of one dtype holding named tensors (slots) back
to back, padded with zeros to a multiple of ``alignment``: 64-byte aligned host
memory, or memory of ``device`` (a ``Device``: CUDA, or the host implementation).)doc")
      .def(py::init([](std::string name, int dtype,
                       const std::vector<std::pair<std::string, std::vector<int64_t>>>& tensors, size_t alignment,
                       DevicePtr device) {
             std::vector<SlotSpec> specs;
             specs.reserve(tensors.size());
             for (const auto& t : tensors) specs.push_back(SlotSpec{t.first, t.second});
             return std::make_shared<Bucket>(std::move(name), to_dtype(dtype), std::move(specs), alignment,
                                             std::move(device));
           }),
           py::arg("name"), py::arg("dtype"), py::arg("tensors"), py::arg("alignment") = 1, py::arg("device") = nullptr)
      .def_property_readonly("device", &Bucket::device, "The Device of the memory (None: plain host memory).")
      .def_property_readonly("name", &Bucket::name)
      .def_property_readonly(
          "dtype", [](const Bucket& b) { return dtype_code(b.dtype()); }, "DType code.")
      .def_property_readonly("alignment", &Bucket::alignment)
      .def_property_readonly("numel", &Bucket::numel)
      .def_property_readonly("payload_numel", &Bucket::payload_numel)
      .def_property_readonly("nbytes", &Bucket::nbytes)
      .def_property_readonly("address", [](const Bucket& b) { return reinterpret_cast<uintptr_t>(b.data()); })
      .def_property_readonly("num_slots", &Bucket::num_slots)
      .def_property_readonly("slot_names",
                             [](const Bucket& b) {
                               std::vector<std::string> out;
                               for (const auto& s : b.slots()) out.push_back(s.name);
                               return out;
                             })
      .def(
          "slot",
          [](const Bucket& b, const py::handle& key) {
            const Slot& s = b.slot(slot_index(b, key));
            py::dict d;
            d["name"] = s.name;
            d["offset"] = s.offset;
            d["numel"] = s.numel;
            d["shape"] = s.shape;
            d["is_padding"] = s.is_padding;
            return d;
          },
          py::arg("key"), "Layout of a slot (by index or name): name, offset, numel, shape, is_padding.")
      .def(
          "slot_index", [](const Bucket& b, const std::string& name) { return b.find_slot(name); }, py::arg("name"),
          "Index of the named slot, or -1.")
      .def(
          "view", [](const BucketPtr& b, const py::handle& key) { return slot_view(b, slot_index(*b, key)); },
          py::arg("key"), "Zero-copy view of one slot (by index or name), in its shape.")
      .def("flat_view", &bucket_view, "Zero-copy 1-D view of the whole bucket, padding included.")
      .def("__repr__",
           [](const Bucket& b) { return "<" + b.describe() + ", numel=" + std::to_string(b.numel()) + ">"; });

  py::class_<Op, std::shared_ptr<Op>>(m, "Op", "An algorithm step bound to one bucket.")
      .def_property_readonly("description", &Op::describe)
      .def("__repr__", [](const Op& o) { return "<Op " + o.describe() + ">"; });

  py::class_<StepOp, Op, std::shared_ptr<StepOp>>(m, "StepOp", R"doc(
A registered algorithm step (ops/registry.h) bound to one bucket. It counts
executions (one per training step). Weight steps (has_result) write a result
buffer (the peer average); copy_back() writes it into the bucket after
Engine.wait().)doc")
      .def_property("step", &StepOp::step, &StepOp::set_step,
                    "Executions so far (one per training step); settable to restore a checkpoint.")
      .def_property_readonly("communicates_next", &StepOp::communicates_next)
      .def_property_readonly("last_communicated", &StepOp::last_communicated)
      .def_property_readonly("has_result", &StepOp::has_result)
      .def(
          "copy_back",
          [](StepOp& o, std::optional<uintptr_t> stream) {
            const std::optional<Stream> s = stream_arg(stream);
            py::gil_scoped_release release;
            return o.copy_back(s);
          },
          py::arg("stream") = py::none(),
          "bucket <- result if the step has one and the last execution communicated; returns whether it copied. "
          "Device buckets: enqueued on `stream` (after Engine.wait(stream)), else on the comm stream and waited for.")
      .def(
          "result_view",
          [](const StepOp& o) {
            const BucketPtr& b = o.bucket();
            if (!b) throw InvalidArgument("the op is not part of a bucket's chain");
            if (!o.has_result()) throw InvalidArgument(o.describe() + " works in place: it has no result buffer");
            return MemoryView{o.result_memory(),
                              o.result_memory().get(),
                              {static_cast<int64_t>(b->numel())},
                              b->dtype(),
                              dl_device_of(*b)};
          },
          "Zero-copy 1-D view of the result buffer (the bucket's layout).")
      .def_property_readonly("num_state", &StepOp::num_state, "Number of state spans of the step (0: stateless).")
      .def_property_readonly(
          "state_data_shaped", [](const StepOp& o) { return o.num_state() > 0 && o.state_layout().data_shaped; },
          "Whether each state span has the bucket's layout (its tensors back to back, then padding).")
      .def(
          "state_view",
          [](const StepOp& o) {
            const BucketPtr& b = o.bucket();
            if (!b) throw InvalidArgument("the op is not part of a bucket's chain");
            if (o.num_state() == 0) throw InvalidArgument(o.describe() + " keeps no state");
            const StateLayout& sl = o.state_layout();
            return MemoryView{o.state_memory(),
                              o.state_memory().get(),
                              {static_cast<int64_t>(sl.spans), static_cast<int64_t>(sl.span_count)},
                              sl.dtype,
                              dl_device_of(*b)};
          },
          "Zero-copy (spans, span elements) view of the step's state: (num_state, bucket numel) of the bucket's "
          "dtype for most steps (e.g. replicas), the step's own layout for others (low rank: error memory and Q); "
          "read or write it only between steps.");

  m.def("step_names", &step_names, "Names of the registered algorithm steps.");
  m.def(
      "step_info",
      [](const std::string& name, const py::dict& params, CommunicatorPtr comm, CommunicatorPtr intra,
         CommunicatorPtr inter) {
        StepPtr s =
            make_step(name, make_comms(std::move(comm), std::move(intra), std::move(inter)), step_params(name, params));
        py::dict d;
        d["description"] = s->describe();
        d["alignment"] = s->alignment();
        d["has_result"] = s->has_result();
        d["num_state"] = s->num_state();
        return d;
      },
      py::arg("name"), py::arg("params"), py::arg("comm"), py::arg("intra") = nullptr, py::arg("inter") = nullptr,
      "Makes the step over these communicators (raising ValueError for bad parameters or a group it cannot run "
      "on) and describes it: description, alignment, has_result, num_state.");

  m.def(
      "step_state_layout",
      [](const std::string& name, const py::dict& params, int dtype, const std::vector<std::vector<int64_t>>& shapes,
         size_t count, CommunicatorPtr comm, CommunicatorPtr intra, CommunicatorPtr inter) {
        const DType dt = to_dtype(dtype);
        StepPtr s = make_step(name, make_comms(std::move(comm), std::move(intra), std::move(inter)),
                              step_params(name, params), consecutive_layout(shapes));
        s->check(dt, count);
        const StateLayout sl = s->num_state() > 0 ? s->state_layout(dt, count) : StateLayout{0, 0, dt};
        py::dict d;
        d["spans"] = sl.spans;
        d["span_count"] = sl.span_count;
        d["dtype"] = dtype_code(sl.dtype);
        d["init"] = sl.init == StateInit::kZero ? "zero" : "copy_of_data";
        d["data_shaped"] = sl.data_shaped;
        return d;
      },
      py::arg("name"), py::arg("params"), py::arg("dtype"), py::arg("shapes"), py::arg("count"), py::arg("comm"),
      py::arg("intra") = nullptr, py::arg("inter") = nullptr,
      "The state block of the step on a bucket of `count` elements of `dtype` holding tensors of `shapes` back to "
      "back: spans, span_count, dtype (code), init (\"copy_of_data\" or \"zero\": what the block starts as), "
      "data_shaped (each span has the data's layout; else the block is the step's own).");

  py::class_<AsyncAverager, std::shared_ptr<AsyncAverager>>(m, "AsyncAverager", R"doc(
Asynchronous model average's background loop over weight buckets (see
csrc/sched/async_averager.h): rounds of averaging every sync_interval_ms on its
own communicator, a weight lock for the training thread, start/abort.)doc")
      .def(py::init([](CommunicatorPtr comm, const std::vector<BucketPtr>& weights, const py::dict& params,
                       std::optional<double> timeout_s, CommunicatorPtr control) {
             if (!comm) throw InvalidArgument("AsyncAverager: comm is required");
             std::chrono::milliseconds timeout = comm->timeout();
             if (timeout_s) {
               if (!(*timeout_s > 0) || !std::isfinite(*timeout_s))
                 throw InvalidArgument("AsyncAverager: timeout_s must be a positive number");
               timeout = std::chrono::milliseconds(static_cast<int64_t>(std::ceil(*timeout_s * 1000.0)));
             }
             const std::string name = "async_model_average";
             auto step = std::dynamic_pointer_cast<const AsyncModelAverageStep>(
                 make_step(name, CommSet{comm, nullptr, nullptr}, step_params(name, params)));
             return std::make_shared<AsyncAverager>(std::move(step), weights, timeout, std::move(control));
           }),
           py::arg("comm"), py::arg("weights"), py::arg("params") = py::dict(), py::arg("timeout_s") = py::none(),
           py::arg("control") = nullptr,
           "Device weights: comm serves device memory (NCCL, or staged) and control is a host communicator of "
           "the same ranks for the stop flags.")
      .def("start", &AsyncAverager::start, py::call_guard<py::gil_scoped_release>())
      .def("abort", &AsyncAverager::abort, py::call_guard<py::gil_scoped_release>())
      .def("lock_weights", &AsyncAverager::lock_weights, py::call_guard<py::gil_scoped_release>())
      .def(
          "unlock_weights",
          [](AsyncAverager& a, std::optional<uintptr_t> stream) { a.unlock_weights(stream_arg(stream)); },
          py::arg("stream") = py::none(),
          "stream: on a device, the training stream that changed the weights (the loop waits for it).")
      .def("check", &AsyncAverager::check)
      .def_property_readonly("running", &AsyncAverager::running)
      .def_property_readonly("rounds", &AsyncAverager::rounds)
      .def_property_readonly("description", &AsyncAverager::describe)
      .def("close", &AsyncAverager::close, py::call_guard<py::gil_scoped_release>())
#ifdef BAGUA_WITH_TEST_BINDINGS
      // for tests only (see csrc/sched/async_averager.h)
      .def("_test_hold", &AsyncAverager::test_hold, py::arg("on"))
      .def(
          "_test_wait_held",
          [](AsyncAverager& a, double timeout_s) {
            return a.test_wait_held(std::chrono::milliseconds(static_cast<int64_t>(timeout_s * 1000.0)));
          },
          py::arg("timeout_s"), py::call_guard<py::gil_scoped_release>(),
          "For tests: waits until a held round took its snapshot; False after timeout_s.")
      .def("_test_release_held", &AsyncAverager::test_release_held)
#endif
      ;

  py::class_<AsyncWeights, std::shared_ptr<AsyncWeights>>(m, "AsyncWeights", R"doc(
The weights a JAX program trains with while an AsyncAverager averages them, and
their training step (csrc/sched/async_weights.h): leaf i is the slot named
leaves[i][1] of the host bucket leaves[i][0]. register_async_weights gives the
handle a jitted program names it by.)doc")
      .def(py::init([](std::shared_ptr<AsyncAverager> averager,
                       const std::vector<std::pair<BucketPtr, std::string>>& leaves, int64_t warmup_steps) {
             std::vector<AsyncWeights::Leaf> slots;
             for (const auto& [bucket, name] : leaves) {
               if (!bucket) throw InvalidArgument("AsyncWeights: a leaf's bucket is None");
               const int64_t slot = bucket->find_slot(name);
               if (slot < 0) throw InvalidArgument("AsyncWeights: " + bucket->describe() + " has no slot " + name);
               slots.push_back({bucket, static_cast<size_t>(slot)});
             }
             return std::make_shared<AsyncWeights>(std::move(averager), std::move(slots), warmup_steps);
           }),
           py::arg("averager"), py::arg("leaves"), py::arg("warmup_steps"))
      .def_property_readonly("started", &AsyncWeights::started);
  m.def("register_async_weights", &register_async_weights, py::arg("weights"),
        "A handle naming `weights` in jitted programs (the \"weights\" attribute of bagua_async_step).");
  m.def("rebind_async_weights", &rebind_async_weights, py::arg("handle"), py::arg("weights"),
        "Points `handle` at `weights`: programs traced before reach them.");
  m.def("unregister_async_weights", &unregister_async_weights, py::arg("handle"));

  py::class_<Engine, std::shared_ptr<Engine>>(m, "Engine", R"doc(
The overlap engine of one process group: ordered buckets, per-tensor readiness
and one comm thread per lane (bucket i on lane i % num_lanes). A bucket launches
when all its tensors are marked ready and every earlier bucket has launched;
wait() ends the step and re-raises the first failure. See csrc/sched/engine.h.)doc")
      .def(py::init([](CommunicatorPtr comm, CommunicatorPtr intra, CommunicatorPtr inter,
                       std::optional<double> timeout_s, const std::vector<LaneComms>& more_lanes) {
             std::vector<CommSet> lanes{make_comms(std::move(comm), std::move(intra), std::move(inter))};
             for (const auto& [g, i, o] : more_lanes) lanes.push_back(make_comms(g, i, o));
             std::chrono::milliseconds timeout = lanes.front().global->timeout();
             if (timeout_s) {
               if (!(*timeout_s > 0) || !std::isfinite(*timeout_s))
                 throw InvalidArgument("Engine: timeout_s must be a positive number");
               timeout = std::chrono::milliseconds(static_cast<int64_t>(std::ceil(*timeout_s * 1000.0)));
             }
             return std::make_shared<Engine>(std::move(lanes), timeout);
           }),
           py::arg("comm"), py::arg("intra") = nullptr, py::arg("inter") = nullptr, py::arg("timeout_s") = py::none(),
           py::arg("more_lanes") = std::vector<LaneComms>(),
           "more_lanes: (comm, intra, inter) of each further lane (its own communicators and comm thread).")
      .def_property_readonly("num_lanes", &Engine::num_lanes)
      .def_property_readonly("timeout_s", [](const Engine& e) { return e.timeout().count() / 1000.0; })
      .def("add_bucket", &Engine::add_bucket, py::arg("bucket"), "Appends a bucket (launch order); returns its index.")
      .def("clear_buckets", &Engine::clear_buckets, py::call_guard<py::gil_scoped_release>())
      .def_property_readonly("num_buckets", &Engine::num_buckets)
      .def("bucket", &Engine::bucket, py::arg("index"))
      .def(
          "append_op",
          [](Engine& e, size_t bucket, const std::string& name, const py::dict& params) {
            auto op = std::make_shared<StepOp>(
                make_step(name, e.comms_for(bucket), step_params(name, params), bucket_layout(*e.bucket(bucket))));
            e.append_op(bucket, op);
            return op;
          },
          py::arg("bucket"), py::arg("name"), py::arg("params") = py::dict(),
          "Appends the registered step `name` with `params` to the bucket's chain; returns the StepOp.")
      .def(
          "step_alignment",
          [](Engine& e, const std::string& name, const py::dict& params) {
            return make_step(name, e.comms(), step_params(name, params))->alignment();
          },
          py::arg("name"), py::arg("params") = py::dict(),
          "The element-count multiple the step needs on this engine's communicators.")
      .def("clear_ops", &Engine::clear_ops, py::arg("bucket"))
      .def("ops", &Engine::ops, py::arg("bucket"))
      .def(
          "mark_ready",
          [](Engine& e, size_t bucket, size_t slot, std::optional<uintptr_t> stream) {
            e.mark_ready(bucket, slot, stream_arg(stream));
          },
          py::arg("bucket"), py::arg("slot"), py::arg("stream") = py::none(),
          "stream: the stream that produced the tensor (device buckets; None: already final).")
      .def(
          "mark_ready",
          [](Engine& e, const std::string& name, std::optional<uintptr_t> stream) {
            e.mark_ready(name, stream_arg(stream));
          },
          py::arg("name"), py::arg("stream") = py::none())
      .def(
          "mark_bucket_ready",
          [](Engine& e, size_t bucket, std::optional<uintptr_t> stream) {
            e.mark_bucket_ready(bucket, stream_arg(stream));
          },
          py::arg("bucket"), py::arg("stream") = py::none())
      .def(
          "mark_all_ready", [](Engine& e, std::optional<uintptr_t> stream) { e.mark_all_ready(stream_arg(stream)); },
          py::arg("stream") = py::none())
      .def(
          "wait",
          [](Engine& e, std::optional<uintptr_t> stream) {
            const std::optional<Stream> s = stream_arg(stream);
            py::gil_scoped_release release;
            e.wait(s);
          },
          py::arg("stream") = py::none(),
          "Ends the step. Device buckets: `stream` (the optimizer's) waits for the step's device work; "
          "None: the call blocks until the device finished it.")
      .def(
          "wait_any",
          [](Engine& e, const std::vector<size_t>& buckets, std::optional<uintptr_t> stream) {
            const std::optional<Stream> s = stream_arg(stream);
            py::gil_scoped_release release;
            return e.wait_any(buckets, s);
          },
          py::arg("buckets"), py::arg("stream") = py::none(),
          "The lowest of `buckets` (indices) that has finished in the current step, waiting for one if none has; "
          "does not end the step (wait() does). Timeouts and failures as wait(). Device buckets: `stream` waits "
          "for that bucket's device work; None: the call blocks until the device finished it.")
      .def_property_readonly("device", &Engine::device, "The buckets' Device (None: host memory).")
      .def(
          "lane_stream", [](const Engine& e, size_t lane) { return reinterpret_cast<uintptr_t>(e.lane_stream(lane)); },
          py::arg("lane"), "Lane `lane`'s comm stream handle (0 for host buckets).")
      .def(
          "timings",
          [](const Engine& e) {
            py::list out;
            for (const auto& t : e.timings()) out.append(timing_tuple(t));
            return out;
          },
          "Per bucket (ready_ns, launch_ns, start_ns, end_ns) of the current or last step (monotonic_ns clock; -1: not "
          "yet).")
      .def_property("record_ready", &Engine::record_ready, &Engine::set_record_ready,
                    "Record when each tensor and bucket becomes ready (between steps; off by default).")
      .def("slot_ready_ns", &Engine::slot_ready_ns, py::arg("bucket"),
           "Per slot of the bucket, when it was marked ready in the current or last step (-1: not recorded).")
      .def_property_readonly("launches", &Engine::launches)
      .def_property_readonly("steps", &Engine::steps)
      .def_property_readonly("in_step", &Engine::in_step)
      .def_property_readonly("broken", &Engine::broken)
      .def("close", &Engine::close, py::call_guard<py::gil_scoped_release>());
}

}  // namespace bindings
}  // namespace bagua
