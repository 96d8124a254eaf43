#include "kernels/cpu_isa.h"

#include <atomic>
#include <string>

#include "common/error.h"

namespace bagua {
namespace {

CpuIsa detect() {
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
  // __builtin_cpu_supports also checks that the OS saves the wider registers (XGETBV).
  if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw")) return CpuIsa::kAvx512;
  if (__builtin_cpu_supports("avx2")) return CpuIsa::kAvx2;
#endif
  return CpuIsa::kBaseline;
}

CpuIsa best() {
  static const CpuIsa isa = detect();
  return isa;
}

std::atomic<int>& current() {
  static std::atomic<int> isa{static_cast<int>(best())};
  return isa;
}

}  // namespace

const char* cpu_isa_name(CpuIsa isa) {
  switch (isa) {
    case CpuIsa::kBaseline: return "baseline";
    case CpuIsa::kAvx2: return "avx2";
    case CpuIsa::kAvx512: return "avx512";
  }
  return "unknown";
}

bool cpu_isa_supported(CpuIsa isa) {
  return static_cast<int>(isa) >= 0 && static_cast<int>(isa) <= static_cast<int>(best());
}

CpuIsa cpu_isa() { return static_cast<CpuIsa>(current().load(std::memory_order_relaxed)); }

void set_cpu_isa(CpuIsa isa) {
  if (!cpu_isa_supported(isa))
    throw InvalidArgument(std::string("CPU kernels for ") + cpu_isa_name(isa) +
                          " cannot run here: this CPU supports up to " + cpu_isa_name(best()));
  current().store(static_cast<int>(isa), std::memory_order_relaxed);
}

}  // namespace bagua
