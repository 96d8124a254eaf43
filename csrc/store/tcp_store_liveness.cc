#include "store/tcp_store_liveness.h"

#include <algorithm>

namespace bagua {

StoreLiveness::Verdict StoreLiveness::check(const ConnLiveness& c, const ConnActivity& a, time_point now) const {
  // A blocked request answers for its own connection: its deadline comes first.
  if (a.pending && now >= c.pending_deadline_) return Verdict::kPendingExpired;
  const bool stalled = (!a.authenticated && now >= c.accepted_ + io_timeout_) ||
                       (c.partial_ && now >= c.partial_since_ + io_timeout_) ||
                       (a.sending && now >= c.out_since_ + io_timeout_);
  if (stalled) return Verdict::kStalled;
  if (idle(c, a) && idle_timeout_.count() > 0 && now >= c.last_active_ + idle_timeout_) return Verdict::kIdle;
  return Verdict::kKeep;
}

StoreLiveness::time_point StoreLiveness::next_check(const ConnLiveness& c, const ConnActivity& a) const {
  time_point next = time_point::max();
  if (!a.authenticated) next = std::min(next, c.accepted_ + io_timeout_);
  if (c.partial_) next = std::min(next, c.partial_since_ + io_timeout_);
  if (a.sending) next = std::min(next, c.out_since_ + io_timeout_);
  if (a.pending) next = std::min(next, c.pending_deadline_);
  if (idle(c, a) && idle_timeout_.count() > 0) next = std::min(next, c.last_active_ + idle_timeout_);
  return next;
}

void StoreLiveness::closed(int rank, bool authenticated, bool goodbye) {
  if (authenticated && !goodbye && rank >= 0) dead_.insert(rank);
}

void StoreLiveness::authenticated(int rank) {
  if (rank >= 0) dead_.erase(rank);
}

}  // namespace bagua
