// An algorithm's communication step: a stateless function over spans.
//
// A Step is configured once (its communicators and hyperparameters) and then
// run any number of times. run() reads and writes only what it is given: the
// data span (gradients, or weights), the result span of weight algorithms (the
// peer average; equal to `data` for in-place steps), the step number and an
// execution context (device, stream, scratch memory), and the step's state
// spans. It keeps no state of its own between runs: counters, replicas and
// momentum are passed in by its two
// adapters, the engine's bucket op (sched/bucket_step_op.h, torch) and the XLA FFI
// handler (ffi/xla_step_adapter.cc, JAX). Both frontends therefore run the same code and
// get the same numbers.
//
// State: a step may ask for num_state() spans of the data's size and dtype
// (low-precision decentralized: its replicas). The adapter allocates them as
// one block (span k at element k * count), initialises every span as
// state_init() says when it binds the step (a copy of the data: the weights,
// identical on all ranks; or zeros: ByteGrad's error-feedback residual),
// zeroes the spans' padding before every run (as the data's), and keeps them
// between runs: the engine's StepOp in host memory (torch
// checkpoints it), the XLA handler as an extra operand aliased to an extra
// result (JAX keeps it in the optax state).
//
// A step may instead size its state from the bucket's layout (state_layout():
// low rank's error memory and Q matrices, in float32 for 16-bit data). Such
// state starts as zeros, and the adapters leave its contents to the step.
//
// Layout: steps that treat the bucket's tensors one by one (low rank: each
// matrix) need each tensor's place and shape in the bucket. Both adapters
// know them when they make the step (the engine from the bucket's slots,
// bindings/engine.cc append_op; the XLA handler from its leaves' shapes,
// ffi/xla_step_adapter.cc), and pass them to make_step as a BucketLayout: the tensors in
// bucket order, padding excluded. Steps that do not need it ignore it.
//
// Steps are named in one registry (ops/registry.h); their parameters arrive as
// a StepParams (key -> bool / int / string), checked when the step is made.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <variant>
#include <vector>

#include "comm/communicator.h"
#include "common/dtype.h"
#include "device/device.h"
#include "ops/comm_set.h"

namespace bagua {

// A typed window on memory of the context's device.
struct Span {
  void* data = nullptr;
  size_t count = 0;  // elements
  DType dtype = DType::kFloat32;

  size_t nbytes() const { return count * dtype_size(dtype); }
};

// One tensor of a bucket: its first element (from the bucket's start), its
// element count and its shape (the product of `shape` is `numel`).
struct TensorLayout {
  size_t offset = 0;
  size_t numel = 0;
  std::vector<int64_t> shape;
};
// A bucket's tensors in bucket order, padding excluded (see above).
using BucketLayout = std::vector<TensorLayout>;

// What a step's state starts as when the adapter binds it.
enum class StateInit { kCopyOfData, kZero };

// A step's state block: `spans` spans of `span_count` elements of `dtype`,
// one after the other, starting as `init` says. `data_shaped`: each span has
// the data's layout (span_count is the data's count, dtype its dtype) and its
// padding is zeroed every run, as the data's; otherwise the block is the
// step's own (only kZero then).
struct StateLayout {
  int spans = 0;
  size_t span_count = 0;
  DType dtype = DType::kFloat32;
  StateInit init = StateInit::kCopyOfData;
  bool data_shaped = true;

  size_t count() const { return static_cast<size_t>(spans) * span_count; }
  size_t nbytes() const { return count() * dtype_size(dtype); }
};

// Scratch memory a step may use during one run (compressed records, a
// partner's weights). Slots are indexed by the step; memory of a slot stays
// valid until the next get() of the same slot with a larger size.
class Scratch {
 public:
  virtual ~Scratch() = default;
  virtual void* get(int slot, size_t nbytes) = 0;
};

// Grow-only scratch: allocated once per slot (on `device`, or in plain host
// memory without one), reused by later runs. A slot only grows when a run
// asks for more than before, so steady-state steps allocate nothing.
class GrowOnlyScratch : public Scratch {
 public:
  explicit GrowOnlyScratch(DevicePtr device = nullptr) : device_(std::move(device)) {}
  void* get(int slot, size_t nbytes) override;

 private:
  DevicePtr device_;
  std::vector<std::shared_ptr<void>> memory_;
  std::vector<size_t> sizes_;
};

// Where a step runs. Plain host (device == kCPU, no `dev`): element math runs
// at once on the calling thread. On a Device (`dev` set, device/device.h):
// element math, copies and memsets are enqueued on `stream` (CUDA launches,
// or the host device's queue), and communicators get `stream`.
struct ExecContext {
  DeviceType device = DeviceType::kCPU;
  Stream stream = nullptr;  // cudaStream_t on CUDA, the host device's queue
  Scratch* scratch = nullptr;
  Device* dev = nullptr;  // null: plain host
};

// Hyperparameters of a step. Typed getters throw InvalidArgument naming the
// step and the key on a wrong type; check_known() rejects unknown keys.
class StepParams {
 public:
  using Value = std::variant<bool, int64_t, std::string>;

  StepParams() = default;
  explicit StepParams(std::map<std::string, Value> values) : values_(std::move(values)) {}
  // "key=value;key=value" (the form the XLA FFI attribute carries): "true" /
  // "false" are bools, integers are ints, anything else a string.
  static StepParams parse(const std::string& text);
  std::string to_string() const;

  void set(const std::string& key, Value v) { values_[key] = std::move(v); }
  bool has(const std::string& key) const { return values_.count(key) > 0; }
  bool get_bool(const std::string& step, const std::string& key, bool fallback) const;
  int64_t get_int(const std::string& step, const std::string& key, int64_t fallback) const;
  std::string get_string(const std::string& step, const std::string& key, const std::string& fallback) const;
  // An int, or a string holding a decimal (the frontends send floats as repr()).
  double get_double(const std::string& step, const std::string& key, double fallback) const;
  void check_known(const std::string& step, const std::vector<std::string>& keys) const;

 private:
  std::map<std::string, Value> values_;
};

// How the adapters initialise a step's state spans (see above).
class Step {
 public:
  virtual ~Step() = default;
  // e.g. "bytegrad(hierarchical=true, average=true)"
  virtual std::string describe() const = 0;
  // Element counts must be a multiple of this (ByteGrad: its chunk count).
  virtual size_t alignment() const { return 1; }
  // True when the step writes a result span separate from its data (weights
  // -> peer average); false for steps that work in place.
  virtual bool has_result() const { return false; }
  // Throws InvalidArgument when the step cannot run on `count` elements of
  // `dtype` (dtype, alignment).
  virtual void check(DType dtype, size_t count) const;
  // Whether run(step) communicates (decentralized: every interval-th step).
  virtual bool communicates(int64_t step) const { return true; }
  // The collectives run(step) will make on `data`, appended to `calls`, when
  // all of them go to `comm`; false when unknown or some go elsewhere.
  virtual bool predict_calls(const Communicator& comm, Span data, int64_t step, std::vector<OpDesc>* calls) const {
    (void)comm, (void)data, (void)step, (void)calls;
    return false;
  }
  // Runs step number `step` (0-based) and returns whether it communicated.
  // In-place steps get result.data == data.data. Without communication the
  // result span is left untouched.
  virtual bool run(const ExecContext& ctx, Span data, Span result, int64_t step) const = 0;

  // Number of state spans (see above); 0 for stateless steps.
  virtual int num_state() const { return 0; }
  // What data-shaped state spans start as (the default state_layout()'s init).
  virtual StateInit state_init() const { return StateInit::kCopyOfData; }
  // The state block for data of `count` elements of `dtype`: by default
  // num_state() data-shaped spans starting as state_init() says.
  virtual StateLayout state_layout(DType dtype, size_t count) const {
    return StateLayout{num_state(), count, dtype, state_init(), true};
  }
  // run() with the state spans (state.size() == num_state(), laid out as
  // state_layout() says: by default each of the data's count and dtype).
  // Stateful steps override this one; the default
  // ignores `state` and calls run().
  virtual bool run_with_state(const ExecContext& ctx, Span data, Span result, const std::vector<Span>& state,
                              int64_t step) const {
    return run(ctx, data, result, step);
  }
};

// The spans of a state block holding `n` spans of `count` elements of `dtype`.
std::vector<Span> state_spans(void* block, int n, size_t count, DType dtype);

using StepPtr = std::shared_ptr<const Step>;

}  // namespace bagua
