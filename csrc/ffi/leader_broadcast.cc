#include "ffi/leader_broadcast.h"

#include <condition_variable>
#include <cstring>
#include <deque>
#include <map>
#include <mutex>
#include <string>
#include <utility>

#include "common/error.h"

namespace bagua {
namespace ffi {
namespace {

struct Slot {
  std::vector<int64_t> arrived;  // calls so far, per position
  int64_t published = -1;        // the call number the leader's buffers belong to
  std::vector<ByteSpan> source;  // the leader's buffers while published
  int64_t copied = 0;            // followers done with `published`
  std::string broken;            // why every later call fails (a timeout, a failed run)
};

using Key = std::pair<int64_t, int64_t>;  // (run id, site)

std::mutex mu;
std::condition_variable changed;
std::map<Key, Slot> slots;                                // idle slots are erased, so this holds the calls in flight
std::deque<std::pair<int64_t, std::string>> failed_runs;  // (run id, why), the latest last
constexpr size_t kFailedRunsKept = 64;

[[noreturn]] void fail(const Slot& slot) { throw Error("leader broadcast: " + slot.broken); }

Slot& slot_for(const Key& key, int64_t position, int64_t participants) {
  if (participants < 1 || position < 0 || position >= participants)
    throw InvalidArgument("leader broadcast: position " + std::to_string(position) + " of " +
                          std::to_string(participants) + " participants");
  for (const auto& [run, why] : failed_runs)  // before the slot exists: a failed run leaves none behind
    if (run == key.first) throw Error("leader broadcast: " + why);
  Slot& slot = slots[key];
  if (slot.arrived.empty()) slot.arrived.assign(static_cast<size_t>(participants), 0);
  if (static_cast<int64_t>(slot.arrived.size()) != participants)
    throw InvalidArgument("leader broadcast: " + std::to_string(participants) + " participants at a site that has " +
                          std::to_string(slot.arrived.size()));
  if (!slot.broken.empty()) fail(slot);
  return slot;
}

TimeoutError timed_out(Slot& slot, const char* waiting_for, std::chrono::milliseconds timeout) {
  slot.broken = "a device timed out at this call";
  changed.notify_all();
  return TimeoutError(std::string("leader broadcast: waited ") + std::to_string(timeout.count()) + " ms for " +
                      waiting_for);
}

void lead(const Key& key, int64_t participants, std::chrono::steady_clock::time_point deadline,
          std::chrono::milliseconds timeout, const std::vector<ByteSpan>& arrays) {
  std::unique_lock<std::mutex> lock(mu);
  Slot& slot = slot_for(key, 0, participants);
  slot.published = slot.arrived[0]++;
  slot.source = arrays;
  slot.copied = 0;
  changed.notify_all();
  if (!changed.wait_until(lock, deadline, [&] { return !slot.broken.empty() || slot.copied == participants - 1; }))
    throw timed_out(slot, "the other devices to copy", timeout);
  if (!slot.broken.empty()) fail(slot);
  slot.source.clear();
  for (int64_t calls : slot.arrived)
    if (calls != slot.published + 1) return;  // a follower already waits for the next call
  slots.erase(key);
}

void follow(const Key& key, int64_t position, int64_t participants, std::chrono::steady_clock::time_point deadline,
            std::chrono::milliseconds timeout, const std::vector<ByteSpan>& arrays) {
  std::unique_lock<std::mutex> lock(mu);
  Slot& slot = slot_for(key, position, participants);
  const int64_t call = slot.arrived[static_cast<size_t>(position)]++;
  if (!changed.wait_until(lock, deadline, [&] { return !slot.broken.empty() || slot.published == call; }))
    throw timed_out(slot, "the leader device", timeout);
  if (!slot.broken.empty()) fail(slot);
  const std::vector<ByteSpan> source = slot.source;
  lock.unlock();  // the followers copy in parallel; the leader keeps its buffers until all are done
  bool same = source.size() == arrays.size();
  for (size_t i = 0; same && i < arrays.size(); ++i) same = source[i].bytes == arrays[i].bytes;
  if (same)
    for (size_t i = 0; i < arrays.size(); ++i)
      if (arrays[i].data != source[i].data) std::memcpy(arrays[i].data, source[i].data, arrays[i].bytes);
  lock.lock();
  ++slot.copied;
  changed.notify_all();
  if (!same) throw MismatchError("leader broadcast: the leader's arrays differ from this device's in number or size");
}

}  // namespace

void leader_broadcast_run_failed(int64_t run_id, const std::string& why) {
  std::lock_guard<std::mutex> lock(mu);
  const std::string reason = "an engine step of this run failed on the leader device: " + why;
  failed_runs.emplace_back(run_id, reason);
  if (failed_runs.size() > kFailedRunsKept) failed_runs.pop_front();
  for (auto& [key, slot] : slots)
    if (key.first == run_id && slot.broken.empty()) slot.broken = reason;
  changed.notify_all();
}

void leader_broadcast(int64_t run_id, int64_t site, int64_t position, int64_t participants,
                      std::chrono::milliseconds timeout, const std::vector<ByteSpan>& arrays) {
  if (participants == 1) return;
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  const Key key{run_id, site};
  if (position == 0) {
    lead(key, participants, deadline, timeout, arrays);
  } else {
    follow(key, position, participants, deadline, timeout, arrays);
  }
}

}  // namespace ffi
}  // namespace bagua
