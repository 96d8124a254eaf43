#include "comm/gloo/failure_report.h"

#include <algorithm>
#include <cstdlib>
#include <thread>
#include <vector>

#include "common/error.h"

namespace bagua {

using std::chrono::milliseconds;

FailureReport::FailureReport(StorePtr store, std::string prefix, int rank, int size, milliseconds timeout,
                             DeadRanksFn dead_ranks)
    : store_(std::move(store)),
      prefix_(std::move(prefix)),
      rank_(rank),
      size_(size),
      timeout_(timeout),
      dead_ranks_(std::move(dead_ranks)) {}

std::string FailureReport::headline(const std::string& who, const OpDesc& d, uint64_t seq, int peer,
                                    FailureKind kind) const {
  std::string msg = who + ": " + to_string(d) + (d.has_peer() ? " (message #" : " (op #") + std::to_string(seq) + ") ";
  switch (kind) {
    case FailureKind::kTimedOut: msg += "timed out after " + std::to_string(timeout_.count()) + " ms"; break;
    case FailureKind::kLostPeer:
      msg += peer >= 0 ? "lost the connection to peer rank " + std::to_string(peer) : "lost a connection to a peer";
      break;
    case FailureKind::kOther: msg += "failed"; break;
  }
  return msg;
}

std::string FailureReport::explain(const OpDesc& d, uint64_t seq, FailureKind kind, int* dead) {
  const bool collective = !d.has_peer() && kind != FailureKind::kOther;
  if (collective) say_failed(seq);
  std::string msg = dead_ranks_note(kind, dead);
  const std::string absent = collective && *dead < 0 ? absent_ranks_note(seq) : "";
  msg += absent;
  if (kind == FailureKind::kTimedOut && *dead < 0 && absent.empty())
    msg += " (a peer may be stuck, or may have skipped or reordered this operation)";
  return msg;
}

// Ranks the store reports dead. A killed peer's store connection may close
// a moment after its Gloo connections, so a lost peer is asked for briefly.
std::string FailureReport::dead_ranks_note(FailureKind kind, int* first_dead) const {
  if (!dead_ranks_) return "";
  std::vector<int> dead;
  try {
    const auto deadline = std::chrono::steady_clock::now() + milliseconds(500);
    for (;;) {
      dead = dead_ranks_();
      if (!dead.empty() || kind != FailureKind::kLostPeer || std::chrono::steady_clock::now() > deadline) break;
      std::this_thread::sleep_for(milliseconds(50));
    }
  } catch (const std::exception& e) {
    return std::string("; dead ranks unknown: ") + e.what();
  }
  if (dead.empty()) return "";
  *first_dead = dead[0];
  return "; " + ranks_text(dead) + (dead.size() == 1 ? " has died" : " have died");
}

// A failed collective is said in the store (<prefix>/failed/<rank> = its
// op number; a broken communicator fails once), so that the ranks that
// never say it can be named: they did not reach the operation.
std::string FailureReport::failed_key(int r) const { return prefix_ + "/failed/" + std::to_string(r); }

void FailureReport::say_failed(uint64_t seq) const {
  if (!store_) return;
  try {
    const std::string v = std::to_string(seq);
    store_->set(failed_key(rank_), std::vector<uint8_t>(v.begin(), v.end()));
  } catch (const std::exception&) {
  }
}

// Waits briefly for the other ranks to say they failed too (those waiting
// with us fail at once, since we closed our connections), then names those
// that did not, and those that failed at another operation.
std::string FailureReport::absent_ranks_note(uint64_t seq) const {
  if (!store_) return "";
  std::vector<int> absent, elsewhere;
  std::vector<uint64_t> their_ops;
  try {
    // Short enough that the engine's watchdog (1.5 x timeout) sees this error, not its own.
    const auto deadline = std::chrono::steady_clock::now() + std::min(timeout_ / 4, milliseconds(2000));
    std::vector<std::string> keys;
    for (int r = 0; r < size_; ++r) keys.push_back(failed_key(r));
    while (!store_->check(keys) && std::chrono::steady_clock::now() < deadline)
      std::this_thread::sleep_for(milliseconds(50));
    for (int r = 0; r < size_; ++r) {
      if (!store_->check({keys[r]})) {
        absent.push_back(r);
        continue;
      }
      const std::vector<uint8_t> v = store_->get(keys[r], milliseconds(1000));
      const uint64_t op = std::strtoull(std::string(v.begin(), v.end()).c_str(), nullptr, 10);
      if (op != seq) {
        elsewhere.push_back(r);
        their_ops.push_back(op);
      }
    }
  } catch (const std::exception& e) {
    return std::string("; which ranks did not reach op #") + std::to_string(seq) + " is unknown: " + e.what();
  }
  std::string note;
  if (!absent.empty())
    note += "; " + ranks_text(absent) + " did not reach op #" + std::to_string(seq) + " (stuck or busy elsewhere)";
  for (size_t i = 0; i < elsewhere.size(); ++i)
    note += "; rank " + std::to_string(elsewhere[i]) + " failed at op #" + std::to_string(their_ops[i]);
  return note;
}

void throw_failure(FailureKind kind, const std::string& msg, int peer) {
  switch (kind) {
    case FailureKind::kTimedOut: throw TimeoutError(msg);
    case FailureKind::kLostPeer: throw PeerError(msg, peer);
    case FailureKind::kOther: throw Error(msg);
  }
  throw Error(msg);
}

}  // namespace bagua
