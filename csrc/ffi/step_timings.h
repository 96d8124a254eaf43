// Timings of the algorithm steps that jitted JAX programs run (the "bagua_step"
// FFI target), for BAGUA_TRACE: the JAX counterpart of Engine::timings().
//
// While recording is on, every step call adds one record: the model (the
// transform's name), the bucket, the step number, and the bucket's times on
// the engine's clock (monotonic_ns, sched/engine.h):
//   ready  - XLA called the handler: the bucket's leaves are computed and the
//            previous bucket's step has completed (its token);
//   launch - the call was checked and queued on the step thread;
//   start  - the step thread began it (gather, communication, scatter);
//   end    - it finished (or failed).
// Python drains the records (bagua_core/trace.py). Off (the default), a call
// costs one relaxed atomic load: no clock read, no allocation. Records beyond
// kMaxPendingStepTimings that nobody drained are dropped and counted.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "sched/engine.h"

namespace bagua {
namespace ffi {

struct StepTimingRecord {
  std::string model;
  int64_t bucket = 0;
  int64_t step = 0;
  BucketTiming timing;
};

constexpr size_t kMaxPendingStepTimings = 1 << 20;

bool step_timings_on();
void set_step_timings_on(bool on);

// Adds one record (when on).
void record_step_timing(StepTimingRecord record);

// The records since the last drain, in the order the calls finished, and the
// number dropped since then (more than kMaxPendingStepTimings pending).
std::vector<StepTimingRecord> drain_step_timings(int64_t* dropped);

}  // namespace ffi
}  // namespace bagua
