#include "comm/shm/futex_word.h"

#include <linux/futex.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include <climits>

namespace bagua {
namespace futex_word {
namespace {

// Spins this many loads before sleeping: a peer a few microseconds behind is
// met without a system call; a slower one does not cost a core (2-core hosts).
constexpr int kSpinLoads = 256;

inline void cpu_relax() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#elif defined(__aarch64__)
  asm volatile("yield");
#endif
}

long futex(uint32_t* w, int op, uint32_t val, const struct timespec* ts) {
  return ::syscall(SYS_futex, w, op, val, ts, nullptr, 0);
}

}  // namespace

void publish(uint32_t* w, uint32_t value) {
  __atomic_store_n(w, value, __ATOMIC_RELEASE);
  wake_all(w);
}

void wake_all(uint32_t* w) { futex(w, FUTEX_WAKE, INT_MAX, nullptr); }

void wait_for(uint32_t* w, uint32_t target, std::chrono::microseconds slice) {
  for (int i = 0; i < kSpinLoads; ++i) {
    if (reached(load(w), target)) return;
    cpu_relax();
  }
  const uint32_t seen = load(w);
  if (reached(seen, target)) return;
  struct timespec ts;
  ts.tv_sec = static_cast<time_t>(slice.count() / 1000000);
  ts.tv_nsec = static_cast<long>(slice.count() % 1000000) * 1000;
  // Returns at once (EAGAIN) if the word changed since `seen`.
  futex(w, FUTEX_WAIT, seen, &ts);
}

}  // namespace futex_word
}  // namespace bagua
