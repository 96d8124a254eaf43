#include "comm/shm/shm_allreduce.h"

#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <random>

#include "comm/shm/futex_word.h"
#include "comm/shm/host_identity.h"
#include "common/error.h"

namespace bagua {
namespace {

using std::chrono::milliseconds;
using std::chrono::steady_clock;

// Segment layout: the abort word, then one cache line of counters per rank
// (written by that rank only), then per buffer the n slots and the result.
constexpr size_t kLine = 64;
constexpr size_t kAbortOffset = kLine;
constexpr size_t kCountersOffset = 2 * kLine;
constexpr size_t kPage = 4096;
// The abort word holds the aborting rank + 1, with this bit when it timed out.
constexpr uint32_t kAbortTimedOut = 1u << 31;

// A waiter wakes this often to look at the abort word, its deadline and
// (after kDeadCheckAfter) at the ranks the store reports dead.
constexpr auto kSlice = milliseconds(100);
constexpr auto kDeadCheckAfter = milliseconds(200);
constexpr auto kDeadCheckEvery = milliseconds(250);

size_t data_offset(int size) { return (kCountersOffset + kLine * size + kPage - 1) / kPage * kPage; }

std::string text(const std::vector<uint8_t>& v) { return std::string(v.begin(), v.end()); }
std::vector<uint8_t> bytes(const std::string& s) { return std::vector<uint8_t>(s.begin(), s.end()); }

std::string segment_name() {
  std::random_device rd;
  char tail[17];
  std::snprintf(tail, sizeof(tail), "%08x%08x", rd(), rd());
  return "/bagua-" + std::to_string(::getuid()) + "-" + std::to_string(::getpid()) + "-" + tail;
}

}  // namespace

std::unique_ptr<ShmAllreduce> ShmAllreduce::join(const StorePtr& store, const std::string& prefix, int rank, int size,
                                                 bool enabled, ShmAllreduceOptions options) {
  if (options.window_bytes == 0 || options.window_bytes % kLine != 0)
    throw InvalidArgument("shared-memory window must be a positive multiple of 64 bytes, got " +
                          std::to_string(options.window_bytes));
  const std::string identity = enabled ? shm_host_identity() : "";
  const std::string mine = identity.empty() ? "off"
                                            : identity + " window " + std::to_string(options.window_bytes) +
                                                  " threshold " + std::to_string(options.threshold_bytes);
  store->set(prefix + "/shm/host/" + std::to_string(rank), bytes(mine));
  bool same = !identity.empty();
  for (int q = 0; q < size; ++q)
    if (q != rank && text(store->get(prefix + "/shm/host/" + std::to_string(q), options.timeout)) != mine) same = false;
  if (!same) return nullptr;
  return std::unique_ptr<ShmAllreduce>(new ShmAllreduce(store, prefix, rank, size, std::move(options)));
}

ShmAllreduce::ShmAllreduce(StorePtr store, std::string prefix, int rank, int size, ShmAllreduceOptions options)
    : store_(std::move(store)), prefix_(std::move(prefix)), rank_(rank), size_(size), options_(std::move(options)) {}

ShmAllreduce::~ShmAllreduce() = default;

bool ShmAllreduce::map() {
  if (mapped_) return true;
  if (!unavailable_.empty()) return false;
  try {
    unavailable_ = setup_segment();
  } catch (...) {
    segment_.reset();  // unlinks rank 0's name
    throw;
  }
  if (!unavailable_.empty()) {
    segment_.reset();
    std::fprintf(stderr, "bagua: group '%s' rank %d: shared-memory allreduce unavailable, using TCP: %s\n",
                 prefix_.c_str(), rank_, unavailable_.c_str());
    return false;
  }
  mapped_ = true;
  return true;
}

// Returns "" once every rank has mapped the segment, else the first reason one could not.
std::string ShmAllreduce::setup_segment() {
  const size_t total = data_offset(size_) + 2 * (size_ + 1) * options_.window_bytes;
  const std::string name_key = prefix_ + "/shm/name";
  std::string reason;
  if (rank_ == 0) {
    const std::string name = segment_name();
    try {
      segment_.emplace(ShmSegment::create(name, total));
    } catch (const Error& e) {
      reason = e.what();
    }
    store_->set(name_key, bytes(reason.empty() ? name : "!" + reason));
  } else {
    const std::string name = text(store_->get(name_key, options_.timeout));
    if (!name.empty() && name[0] == '!') {
      reason = "rank 0 could not create it: " + name.substr(1);
    } else {
      try {
        segment_.emplace(ShmSegment::open(name, total));
      } catch (const Error& e) {
        reason = e.what();
      }
    }
  }
  store_->set(prefix_ + "/shm/mapped/" + std::to_string(rank_), bytes(reason.empty() ? "ok" : reason));
  std::string first;
  for (int q = 0; q < size_; ++q) {
    const std::string v = text(store_->get(prefix_ + "/shm/mapped/" + std::to_string(q), options_.timeout));
    if (v != "ok" && first.empty()) first = "rank " + std::to_string(q) + ": " + v;
  }
  if (segment_) segment_->unlink();  // every rank has it mapped (or gave up): the name can go
  return first;
}

uint32_t* ShmAllreduce::counter(int rank, Counter c) const {
  auto* base = static_cast<uint8_t*>(segment_->data());
  return reinterpret_cast<uint32_t*>(base + kCountersOffset + kLine * rank) + c;
}

uint32_t* ShmAllreduce::abort_word() const {
  return reinterpret_cast<uint32_t*>(static_cast<uint8_t*>(segment_->data()) + kAbortOffset);
}

uint8_t* ShmAllreduce::slot(int buffer, int rank) const {
  return static_cast<uint8_t*>(segment_->data()) + data_offset(size_) +
         (static_cast<size_t>(buffer) * (size_ + 1) + rank) * options_.window_bytes;
}

uint8_t* ShmAllreduce::result(int buffer) const { return slot(buffer, size_); }

void ShmAllreduce::abort(bool timed_out) {
  if (!mapped_) return;
  uint32_t expected = 0;
  const uint32_t word = static_cast<uint32_t>(rank_ + 1) | (timed_out ? kAbortTimedOut : 0);
  __atomic_compare_exchange_n(abort_word(), &expected, word, false, __ATOMIC_ACQ_REL, __ATOMIC_ACQUIRE);
  for (int q = 0; q < size_; ++q)
    for (Counter c : {kArrived, kReduced, kCopied}) futex_word::wake_all(counter(q, c));
}

void ShmAllreduce::wait_all(Counter c, uint32_t target, const char* step) {
  const auto start = steady_clock::now();
  const auto deadline = start + options_.timeout;
  auto next_dead_check = start + kDeadCheckAfter;
  auto missing = [&] {
    std::vector<int> ranks;
    for (int r = 0; r < size_; ++r)
      if (r != rank_ && !futex_word::reached(futex_word::load(counter(r, c)), target)) ranks.push_back(r);
    return ranks;
  };
  for (int q = 0; q < size_; ++q) {
    if (q == rank_) continue;
    uint32_t* w = counter(q, c);
    while (!futex_word::reached(futex_word::load(w), target)) {
      if (const uint32_t a = futex_word::load(abort_word())) {
        const int by = static_cast<int>((a & ~kAbortTimedOut) - 1);
        if (a & kAbortTimedOut)
          throw ShmTimeout("shared memory: rank " + std::to_string(by) + " timed out after " +
                           seconds(options_.timeout) + " waiting for its peers; this rank was waiting for " +
                           ranks_text(missing()) + " to " + step);
        throw ShmPeerLost("shared memory: rank " + std::to_string(by) +
                              " gave up on this allreduce (its communicator failed or was closed)",
                          by);
      }
      const auto now = steady_clock::now();
      if (now >= next_dead_check && options_.dead_ranks) {
        next_dead_check = now + kDeadCheckEvery;
        std::vector<int> dead;
        try {
          dead = options_.dead_ranks();
        } catch (const std::exception&) {  // the store is gone too: the deadline decides
        }
        if (!dead.empty())
          throw ShmPeerLost("shared memory: " + ranks_text(dead) + (dead.size() == 1 ? " has" : " have") +
                                " died while this rank waited for it to " + step,
                            dead[0]);
      }
      if (now >= deadline)
        throw ShmTimeout("shared memory: timed out after " + seconds(options_.timeout) + " waiting for " +
                         ranks_text(missing()) + " to " + step);
      const auto left = std::chrono::duration_cast<std::chrono::microseconds>(deadline - now);
      futex_word::wait_for(w, target, std::min<std::chrono::microseconds>(left, kSlice));
    }
  }
}

// Chunk k goes in (this rank copies to its slot the parts the other ranks
// reduce; its own part it reads from `send` directly), is reduced (each rank
// its sub-range, into the shared result and its own output) and comes out
// (copy of the other ranks' parts of the result). The next chunk goes in
// before this one comes out, so a rank waiting for its peers' reductions has
// already done the next copy in.
void ShmAllreduce::allreduce(const void* send, void* recv, size_t count, DType dtype, ReduceOp op, ReduceFn fn) {
  if (count == 0) return;
  const size_t es = dtype_size(dtype);
  const size_t per_chunk = options_.window_bytes / es;
  const size_t chunks = (count + per_chunk - 1) / per_chunk;
  const auto* in = static_cast<const uint8_t*>(send);
  auto* out = static_cast<uint8_t*>(recv);
  const uint64_t first = generation_ + 1;  // generation of chunk 0
  auto elems = [&](size_t k) { return std::min(per_chunk, count - k * per_chunk); };
  // Sub-range of rank r in a chunk of m elements.
  auto part_begin = [&](size_t m, int r) { return m * r / size_; };
  auto go_in = [&](size_t k) {
    const uint64_t g = first + k;
    // This buffer last carried generation g-2: every rank must have copied that out.
    if (g > 2) wait_all(kCopied, static_cast<uint32_t>(g - 2), "copy out an earlier chunk");
    const size_t m = elems(k), lo = part_begin(m, rank_), hi = part_begin(m, rank_ + 1);
    const uint8_t* src = in + k * per_chunk * es;
    uint8_t* dst = slot(g & 1, rank_);
    std::memcpy(dst, src, lo * es);
    std::memcpy(dst + hi * es, src + hi * es, (m - hi) * es);
    futex_word::publish(counter(rank_, kArrived), static_cast<uint32_t>(g));
  };
  go_in(0);
  for (size_t k = 0; k < chunks; ++k) {
    const uint64_t g = first + k;
    const int b = static_cast<int>(g & 1);
    const size_t m = elems(k), lo = part_begin(m, rank_), hi = part_begin(m, rank_ + 1);
    const size_t base = k * per_chunk;
    wait_all(kArrived, static_cast<uint32_t>(g), "copy its input in");
    if (hi > lo) {
      auto part_of = [&](int q) -> const uint8_t* { return q == rank_ ? in + (base + lo) * es : slot(b, q) + lo * es; };
      uint8_t* dst = result(b) + lo * es;
      fn(dst, part_of(0), part_of(1), hi - lo);
      for (int q = 2; q < size_; ++q) fn(dst, dst, part_of(q), hi - lo);
      if (op == ReduceOp::kAvg) cpu_average(dst, hi - lo, dtype, size_);
      std::memcpy(out + (base + lo) * es, dst, (hi - lo) * es);  // `send` is read: in place is fine
    }
    futex_word::publish(counter(rank_, kReduced), static_cast<uint32_t>(g));
    if (k + 1 < chunks) go_in(k + 1);
    wait_all(kReduced, static_cast<uint32_t>(g), "reduce its part");
    std::memcpy(out + base * es, result(b), lo * es);
    std::memcpy(out + (base + hi) * es, result(b) + hi * es, (m - hi) * es);
    futex_word::publish(counter(rank_, kCopied), static_cast<uint32_t>(g));
    generation_ = g;
  }
}

}  // namespace bagua
