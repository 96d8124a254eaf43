// When the TCP store server gives a connection up, and which ranks it reports
// dead (Store::dead_ranks).
//
// - Stalled: a connection that has not authenticated within io_timeout of its
//   accept, has sent part of a message and made no progress for io_timeout, or
//   has not read its replies for io_timeout is dropped. Like any close without
//   a goodbye (end of stream, reset, a malformed message), this reports its
//   rank dead once it has authenticated; a stranger never reports a rank dead.
// - Idle: an authenticated connection with no request waiting, no reply unsent
//   and nothing half received that sends nothing for idle_timeout (zero: never)
//   is closed cleanly, and its rank is not reported dead. Silence is not death:
//   a live client pings its idle connections well within idle_timeout, and a
//   frozen rank is found by its peers' own timeouts, not by the store.
// - A blocked get or wait past its deadline is answered kTimeout; the
//   connection stays.
// - A rank that authenticates again is alive again.
//
// Pure policy: no sockets, no clock reads. ConnLiveness keeps one connection's
// clocks, which the server advances as bytes move; StoreLiveness decides from
// them and holds the dead ranks. Not thread-safe: the server thread owns both.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <set>

namespace bagua {

using LivenessClock = std::chrono::steady_clock;

// One connection's clocks.
class ConnLiveness {
 public:
  using time_point = LivenessClock::time_point;

  explicit ConnLiveness(time_point accepted) : accepted_(accepted), last_active_(accepted) {}

  // Bytes arrived: the stall and idle clocks restart.
  void received(time_point now) { partial_since_ = last_active_ = now; }
  // A reply was queued behind nothing unsent, or some reply bytes left: the
  // send stall clock (re)starts.
  void sent(time_point now) { out_since_ = now; }
  // Every reply is sent: a get answered after a long wait is not idle yet.
  void drained(time_point now) { last_active_ = now; }
  // The server looked for the next frame with `buffered` bytes in hand and
  // found it unfinished (or nothing at all): an unfinished frame must finish
  // within io_timeout of when it was first seen.
  void unfinished(size_t buffered, time_point now) {
    if (buffered == 0) {
      partial_ = false;
    } else if (!partial_) {
      partial_ = true;
      partial_since_ = now;
    }
  }
  // A whole frame was taken.
  void framed() {
    partial_ = false;
    partial_since_ = {};
  }
  // A get or wait blocks from `now` for at most `timeout_ms`.
  void blocked(time_point now, int64_t timeout_ms) {
    // Cap so the deadline arithmetic cannot overflow.
    const auto cap = std::chrono::hours(24 * 365 * 10);
    const auto t = std::chrono::milliseconds(timeout_ms);
    pending_deadline_ = now + (t > cap ? std::chrono::duration_cast<std::chrono::milliseconds>(cap) : t);
  }

  time_point accepted() const { return accepted_; }

 private:
  friend class StoreLiveness;
  time_point accepted_;
  time_point partial_since_{};  // last progress of the unfinished frame
  bool partial_ = false;
  time_point out_since_{};  // last progress sending replies
  time_point last_active_;  // last bytes received or last reply fully sent
  time_point pending_deadline_{};
};

// What a connection is doing besides its clocks, as the server sees it.
struct ConnActivity {
  bool authenticated = false;  // finished its handshake
  bool pending = false;        // a get or wait is blocked
  bool sending = false;        // replies not yet fully sent
};

class StoreLiveness {
 public:
  using time_point = LivenessClock::time_point;

  StoreLiveness(std::chrono::milliseconds io_timeout, std::chrono::milliseconds idle_timeout)
      : io_timeout_(io_timeout), idle_timeout_(idle_timeout) {}

  enum class Verdict {
    kKeep,            // nothing is due
    kPendingExpired,  // answer the blocked request kTimeout; the connection stays
    kStalled,         // drop it as a close without goodbye: its rank is dead
    kIdle,            // close it cleanly: its rank is not dead
  };
  Verdict check(const ConnLiveness& c, const ConnActivity& a, time_point now) const;
  // The earliest time check() may say more than kKeep; time_point::max() when
  // nothing is due.
  time_point next_check(const ConnLiveness& c, const ConnActivity& a) const;

  // A connection closed. It reports `rank` dead when it had authenticated and
  // did not say goodbye (a negative rank names no rank).
  void closed(int rank, bool authenticated, bool goodbye);
  // `rank` authenticated: alive again.
  void authenticated(int rank);
  // Ranks reported dead and not authenticated since, ascending.
  const std::set<int>& dead() const { return dead_; }

 private:
  bool idle(const ConnLiveness& c, const ConnActivity& a) const {
    return a.authenticated && !a.pending && !a.sending && !c.partial_;
  }

  const std::chrono::milliseconds io_timeout_;
  const std::chrono::milliseconds idle_timeout_;
  std::set<int> dead_;
};

}  // namespace bagua
