// Counters in shared memory that other processes wait on: a short spin, then
// FUTEX_WAIT (the shared, non-private kind, since the waiters are other
// processes), so a waiting rank gives its core away instead of spinning.
// Counters grow by one per step and may wrap: "reached" compares modulo 2^32.
#pragma once

#include <chrono>
#include <cstdint>

namespace bagua {
namespace futex_word {

inline bool reached(uint32_t value, uint32_t target) { return static_cast<int32_t>(value - target) >= 0; }

inline uint32_t load(const uint32_t* w) { return __atomic_load_n(w, __ATOMIC_ACQUIRE); }

// Stores `value` (release: the data written before it is visible to whoever sees it) and wakes the waiters.
void publish(uint32_t* w, uint32_t value);

// Wakes every waiter on `w` (after another word they watch changed).
void wake_all(uint32_t* w);

// Returns once *w reached `target`, or after `slice` (or a spurious wake-up):
// the caller re-checks its conditions and its deadline and calls again.
void wait_for(uint32_t* w, uint32_t target, std::chrono::microseconds slice);

}  // namespace futex_word
}  // namespace bagua
