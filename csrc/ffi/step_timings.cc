#include "ffi/step_timings.h"

#include <atomic>
#include <mutex>

namespace bagua {
namespace ffi {
namespace {

std::atomic<bool> g_on{false};

struct Pending {
  std::mutex mu;
  std::vector<StepTimingRecord> records;
  int64_t dropped = 0;
};

Pending& pending() {
  static Pending* p = new Pending;  // never destroyed: the step thread may record during exit
  return *p;
}

}  // namespace

bool step_timings_on() { return g_on.load(std::memory_order_relaxed); }

void set_step_timings_on(bool on) { g_on.store(on, std::memory_order_relaxed); }

void record_step_timing(StepTimingRecord record) {
  Pending& p = pending();
  std::lock_guard<std::mutex> g(p.mu);
  if (p.records.size() >= kMaxPendingStepTimings) {
    ++p.dropped;
    return;
  }
  p.records.push_back(std::move(record));
}

std::vector<StepTimingRecord> drain_step_timings(int64_t* dropped) {
  Pending& p = pending();
  std::vector<StepTimingRecord> out;
  std::lock_guard<std::mutex> g(p.mu);
  out.swap(p.records);
  if (dropped) *dropped = p.dropped;
  p.dropped = 0;
  return out;
}

}  // namespace ffi
}  // namespace bagua
