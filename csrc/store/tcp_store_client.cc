#include "store/tcp_store_client.h"

#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <sstream>
#include <thread>

#include "common/descriptors.h"
#include "common/error.h"
#include "common/sha256.h"
#include "store/tcp_store_protocol.h"

namespace bagua {

namespace proto = store_protocol;

namespace {

using Clock = std::chrono::steady_clock;
using std::chrono::milliseconds;

// The server answers a timed-out get/wait itself; the client waits this much
// longer before deciding the server is stuck.
constexpr milliseconds kReplyGrace{5000};
// Longest timeout honoured (keeps deadline arithmetic from overflowing).
constexpr milliseconds kMaxTimeout{milliseconds(int64_t(1000) * 3600 * 24 * 365 * 10)};

milliseconds clamp_timeout(milliseconds t, const char* what) {
  if (t.count() < 0) throw InvalidArgument(std::string("TcpStore.") + what + ": timeout must not be negative");
  return std::min(t, kMaxTimeout);
}

std::string seconds_str(milliseconds t) {
  std::ostringstream s;
  s << double(t.count()) / 1000.0 << "s";
  return s.str();
}

std::string quote_keys(const std::vector<std::string>& keys) {
  std::string s;
  size_t shown = std::min<size_t>(keys.size(), 8);
  for (size_t i = 0; i < shown; ++i) s += (i ? ", '" : "'") + keys[i] + "'";
  if (keys.size() > shown) s += ", ... (" + std::to_string(keys.size()) + " keys)";
  return s;
}

void check_key(const std::string& key, const char* what) {
  if (key.size() > proto::kMaxKeySize) {
    throw InvalidArgument(std::string("TcpStore.") + what + ": key of " + std::to_string(key.size()) +
                          " bytes is longer than the limit of " + std::to_string(proto::kMaxKeySize));
  }
}

void check_keys(const std::vector<std::string>& keys, const char* what) {
  if (keys.size() > proto::kMaxKeysPerRequest) {
    throw InvalidArgument(std::string("TcpStore.") + what + ": " + std::to_string(keys.size()) +
                          " keys exceed the limit of " + std::to_string(proto::kMaxKeysPerRequest));
  }
  for (const auto& k : keys) check_key(k, what);
}

int remaining_ms(Clock::time_point deadline) {
  auto ms = std::chrono::duration_cast<milliseconds>(deadline - Clock::now()).count();
  return int(std::clamp<int64_t>(ms, 0, 1000));  // re-check at least every second
}

void set_socket_options(int fd) {
  int one = 1;
  setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
  // Notice a vanished host within about a minute, not hours.
  setsockopt(fd, SOL_SOCKET, SO_KEEPALIVE, &one, sizeof(one));
  int idle = 30, interval = 5, count = 6;
  setsockopt(fd, IPPROTO_TCP, TCP_KEEPIDLE, &idle, sizeof(idle));
  setsockopt(fd, IPPROTO_TCP, TCP_KEEPINTVL, &interval, sizeof(interval));
  setsockopt(fd, IPPROTO_TCP, TCP_KEEPCNT, &count, sizeof(count));
}

// Signals from the socket layer, turned into Store errors by the caller.
struct IoTimeout {};
struct IoLost {
  std::string why;
};

}  // namespace

// One socket to the server. Used by one call at a time; closed on destruction.
struct TcpStore::Conn {
  int fd = -1;
  milliseconds server_idle{0};  // the server's idle timeout (0: none), told at authentication
  Clock::time_point last_used = Clock::now();

  explicit Conn(int f) : fd(f) {}
  ~Conn() {
    if (fd >= 0) ::close(fd);
  }

  void send_all(const std::string& data, Clock::time_point deadline) {
    size_t off = 0;
    while (off < data.size()) {
      ssize_t n = ::send(fd, data.data() + off, data.size() - off, MSG_NOSIGNAL);
      if (n > 0) {
        off += size_t(n);
        continue;
      }
      if (n < 0 && errno == EINTR) continue;
      if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
        if (Clock::now() >= deadline) throw IoTimeout{};
        pollfd p{fd, POLLOUT, 0};
        ::poll(&p, 1, remaining_ms(deadline));
        continue;
      }
      throw IoLost{std::string("send failed: ") + std::strerror(errno)};
    }
  }

  void recv_all(char* dst, size_t size, Clock::time_point deadline) {
    size_t off = 0;
    while (off < size) {
      ssize_t n = ::recv(fd, dst + off, size - off, 0);
      if (n > 0) {
        off += size_t(n);
        continue;
      }
      if (n == 0) throw IoLost{"connection closed by the server"};
      if (errno == EINTR) continue;
      if (errno == EAGAIN || errno == EWOULDBLOCK) {
        if (Clock::now() >= deadline) throw IoTimeout{};
        pollfd p{fd, POLLIN, 0};
        ::poll(&p, 1, remaining_ms(deadline));
        continue;
      }
      throw IoLost{std::string("receive failed: ") + std::strerror(errno)};
    }
  }

  // Sends a request and returns the reply body. *sent tells whether the whole
  // request went out (then a goodbye can still follow it cleanly).
  std::string exchange(const std::string& frame, Clock::time_point reply_deadline, milliseconds io_timeout,
                       bool* sent) {
    *sent = false;
    send_all(frame, std::max(reply_deadline, Clock::now() + io_timeout));
    *sent = true;
    char header[4];
    recv_all(header, 4, reply_deadline);
    uint32_t len = proto::frame_length(header);
    if (len == 0 || len > proto::kMaxFrameSize) {
      throw IoLost{"protocol error (reply of " + std::to_string(len) + " bytes)"};
    }
    std::string body(len, '\0');
    // Once a reply has started, the rest follows promptly.
    recv_all(&body[0], len, std::max(reply_deadline, Clock::now() + io_timeout));
    return body;
  }

  // Whether the server closed this (pooled, quiet) connection: it then reads
  // as end of stream. Nothing else may arrive on a connection with no request.
  bool closed_by_server() const {
    pollfd p{fd, POLLIN | POLLRDHUP, 0};
    return ::poll(&p, 1, 0) > 0 && (p.revents & (POLLIN | POLLRDHUP | POLLHUP | POLLERR));
  }

  // Best effort, without waiting: queued behind a pending request, the server
  // still reads it as a clean goodbye when the connection closes.
  void goodbye_nowait() {
    std::string bye = proto::Writer().u8(proto::kGoodbye).finish();
    ssize_t n = ::send(fd, bye.data(), bye.size(), MSG_NOSIGNAL | MSG_DONTWAIT);
    (void)n;
  }

  // Goodbye and wait (briefly) until the server has taken it.
  void goodbye(milliseconds timeout) {
    bool sent;
    try {
      std::string bye = proto::Writer().u8(proto::kGoodbye).finish();
      exchange(bye, Clock::now() + std::min(timeout, milliseconds(2000)), timeout, &sent);
    } catch (...) {
    }
  }
};

namespace {
// Idle connections kept for reuse; more are closed after a burst of calls.
constexpr size_t kMaxIdleConns = 8;
}  // namespace

TcpStore::TcpStore(const std::string& host, int port, int rank, milliseconds timeout, std::string secret,
                   milliseconds connect_timeout)
    : host_(host),
      port_(port),
      rank_(rank),
      timeout_(clamp_timeout(timeout, "__init__")),
      secret_(std::move(secret)),
      pid_(getpid()) {
  if (host.empty()) throw InvalidArgument("TcpStore: host must not be empty (give MASTER_ADDR)");
  if (port <= 0 || port > 65535) throw InvalidArgument("TcpStore: port " + std::to_string(port) + " is out of range");
  const milliseconds connect = connect_timeout.count() > 0 ? std::min(connect_timeout, timeout_) : timeout_;
  idle_.push_back(open_conn(Clock::now() + connect, /*retry=*/true));
  const milliseconds server_idle = idle_.back()->server_idle;
  if (server_idle.count() > 0) {
    // Four pings per idle period: a loaded host may delay one or two.
    const milliseconds every = std::max(milliseconds(10), server_idle / 4);
    keep_alive_ = std::make_unique<std::thread>([this, every] { keep_alive_loop(every); });
  }
}

TcpStore::~TcpStore() {
  try {
    close();
  } catch (...) {
  }
  if (keep_alive_ && getpid() != pid_) {
    (void)keep_alive_.release();  // a forked child: the thread is the parent's, leave it be
  }
}

void TcpStore::keep_alive_loop(milliseconds every) {
  std::unique_lock<std::mutex> lock(mu_);
  while (state_ == State::kOpen) {
    stop_cv_.wait_for(lock, every / 2);
    if (state_ != State::kOpen) return;
    // Take out the connections that have been quiet for `every`, ping them
    // without the lock (a caller meanwhile opens another connection).
    const auto now = Clock::now();
    std::vector<std::unique_ptr<Conn>> quiet;
    for (auto it = idle_.begin(); it != idle_.end();) {
      if (now - (*it)->last_used >= every) {
        quiet.push_back(std::move(*it));
        it = idle_.erase(it);
      } else {
        ++it;
      }
    }
    if (quiet.empty()) continue;
    lock.unlock();
    const std::string ping = proto::Writer().u8(proto::kPing).finish();
    for (auto& c : quiet) {
      bool sent = false;
      try {
        std::string body = c->exchange(ping, Clock::now() + std::max(every, milliseconds(1000)), timeout_, &sent);
        if (body.size() != 1 || uint8_t(body[0]) != proto::kOk) c.reset();
      } catch (const IoTimeout&) {
        if (sent) c->goodbye_nowait();  // out of step: close it cleanly
        c.reset();
      } catch (const IoLost&) {
        c.reset();  // acquire() opens a new one when needed
      }
      if (c) c->last_used = Clock::now();
    }
    lock.lock();
    for (auto& c : quiet) {
      if (c && state_ == State::kOpen && idle_.size() < kMaxIdleConns) idle_.push_back(std::move(c));
    }
    // Not taken back (closed meanwhile, or the pool filled up): a goodbye,
    // so that the server does not take this rank for dead.
    const bool lost_store = state_ == State::kLost;
    lock.unlock();
    for (auto& c : quiet)
      if (c && !lost_store) c->goodbye(timeout_);
    quiet.clear();
    lock.lock();
  }
}

void TcpStore::stop_keep_alive() {
  if (!keep_alive_ || getpid() != pid_) return;
  stop_cv_.notify_all();
  if (keep_alive_->joinable() && keep_alive_->get_id() != std::this_thread::get_id()) keep_alive_->join();
}

std::string TcpStore::endpoint() const {
  if (host_.find(':') != std::string::npos) return "[" + host_ + "]:" + std::to_string(port_);
  return host_ + ":" + std::to_string(port_);
}

void TcpStore::check_fork() const {
  if (getpid() != pid_) {
    throw Error("this TcpStore was created in process " + std::to_string(pid_) +
                " and cannot be used after fork(); create a new TcpStore in the child");
  }
}

// Connects and says hello. With `retry`, keeps trying until the deadline (the
// server may not be up yet); without, the server is expected to be there.
std::unique_ptr<TcpStore::Conn> TcpStore::open_conn(Clock::time_point deadline, bool retry) {
  std::string last_error = "no address";
  milliseconds backoff{10};
  for (;;) {
    std::unique_ptr<Conn> conn;
    addrinfo hints{};
    hints.ai_family = AF_UNSPEC;
    hints.ai_socktype = SOCK_STREAM;
    addrinfo* res = nullptr;
    int rc = getaddrinfo(host_.c_str(), std::to_string(port_).c_str(), &hints, &res);
    if (rc != 0 && out_of_descriptors())  // resolving needs a descriptor too
      throw Error(out_of_descriptors_message("connecting to the rendezvous store at " + endpoint()));
    if (rc != 0) last_error = std::string("cannot resolve host: ") + gai_strerror(rc);
    for (addrinfo* ai = rc == 0 ? res : nullptr; ai && !conn; ai = ai->ai_next) {
      int fd = socket(ai->ai_family, ai->ai_socktype | SOCK_NONBLOCK | SOCK_CLOEXEC, ai->ai_protocol);
      if (fd < 0) {
        // Waiting will not free descriptors: say so now.
        if (errno == EMFILE || errno == ENFILE)
          throw Error(out_of_descriptors_message("connecting to the rendezvous store at " + endpoint()));
        last_error = std::strerror(errno);
        continue;
      }
      int err = 0;
      if (::connect(fd, ai->ai_addr, ai->ai_addrlen) != 0) {
        err = errno;
        if (err == EINPROGRESS) {
          pollfd p{fd, POLLOUT, 0};
          int n;
          do {
            n = ::poll(&p, 1, remaining_ms(deadline));
          } while ((n == 0 && Clock::now() < deadline) || (n < 0 && errno == EINTR));
          socklen_t len = sizeof(err);
          if (n > 0) {
            getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &len);
          } else {
            err = ETIMEDOUT;
          }
        }
      }
      if (err != 0) {
        last_error = std::strerror(err);
        ::close(fd);
        continue;
      }
      set_socket_options(fd);
      conn.reset(new Conn(fd));
    }
    if (res) freeaddrinfo(res);

    if (conn) {
      std::string frame = proto::Writer().u8(proto::kHello).u32(proto::kMagic).u32(proto::kVersion).i32(rank_).finish();
      bool sent;
      std::string body;
      try {
        body = conn->exchange(frame, deadline, timeout_, &sent);
      } catch (const IoTimeout&) {
        last_error = "no reply to hello";
        conn.reset();
      } catch (const IoLost& e) {
        // Dropped during the handshake (server starting up or full): retry.
        last_error = "connection closed during handshake";
        conn.reset();
      }
      if (conn) {
        proto::Reader r(body.data(), body.size());
        uint8_t status = r.u8();
        if (status == proto::kError) {
          throw Error("the rendezvous store at " + endpoint() + " refused this client: " + r.str(1 << 20));
        }
        const bool is_store = status == proto::kOk && r.u32() == proto::kMagic;
        const std::string nonce = r.str(proto::kNonceSize);
        if (!is_store || !r.ok() || nonce.size() != proto::kNonceSize) {
          throw Error("the service at " + endpoint() +
                      " is not a Bagua rendezvous store (check MASTER_ADDR and BAGUA_STORE_PORT)");
        }
        const std::string message = proto::auth_message(nonce, rank_);
        const Digest mac = hmac_sha256(secret_, message.data(), message.size());
        std::string proof = proto::Writer().u8(proto::kAuth).str(mac.data(), mac.size()).finish();
        try {
          body = conn->exchange(proof, deadline, timeout_, &sent);
        } catch (const IoTimeout&) {
          throw TimeoutError("the rendezvous store at " + endpoint() + " did not answer the authentication");
        } catch (const IoLost&) {
          throw Error("the rendezvous store at " + endpoint() + " closed the connection during authentication");
        }
        proto::Reader a(body.data(), body.size());
        status = a.u8();
        if (status == proto::kError) {
          throw Error("the rendezvous store at " + endpoint() + " refused this client: " + a.str(1 << 20));
        }
        if (status != proto::kOk) throw Error("the rendezvous store at " + endpoint() + ": bad authentication reply");
        if (!a.at_end()) conn->server_idle = milliseconds(std::max<int64_t>(0, a.i64()));
        return conn;
      }
    }
    if (!retry) throw IoLost{"cannot open another connection: " + last_error};
    auto now = Clock::now();
    if (now >= deadline) {
      throw TimeoutError("could not connect to the rendezvous store at " + endpoint() + " (rank 0) within " +
                         seconds_str(timeout_) + ": " + last_error +
                         "; is rank 0 running, and are MASTER_ADDR and BAGUA_STORE_PORT the same on every rank?");
    }
    std::this_thread::sleep_for(std::min<Clock::duration>(backoff, deadline - now));
    backoff = std::min(backoff * 2, milliseconds(500));
  }
}

std::unique_ptr<TcpStore::Conn> TcpStore::acquire() {
  check_fork();
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (state_ == State::kLost) {
      throw Error("the rendezvous store at " + endpoint() + " (rank 0) is unreachable: " + lost_reason_);
    }
    if (state_ == State::kClosed) throw Error("TcpStore to " + endpoint() + " is closed");
    while (!idle_.empty()) {
      auto c = std::move(idle_.back());
      idle_.pop_back();
      // Closed for silence while this process was frozen: use another one.
      if (!c->closed_by_server()) return c;
    }
  }
  // Every connection is busy (another thread is blocked in a call): open one more.
  try {
    return open_conn(Clock::now() + timeout_, /*retry=*/false);
  } catch (const IoLost& e) {
    lost(e.why);
  }
}

void TcpStore::release(std::unique_ptr<Conn> c) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (state_ == State::kOpen && idle_.size() < kMaxIdleConns) {
      c->last_used = Clock::now();
      idle_.push_back(std::move(c));
      return;
    }
    if (state_ == State::kLost) return;  // just close it
  }
  c->goodbye(timeout_);  // closed meanwhile, or one idle connection too many
}

std::string TcpStore::roundtrip(const std::string& frame, Clock::time_point reply_deadline, const std::string& what) {
  std::unique_ptr<Conn> c = acquire();
  bool sent = false;
  std::string body;
  try {
    body = c->exchange(frame, reply_deadline, timeout_, &sent);
  } catch (const IoTimeout&) {
    // This connection is out of step with its replies: drop it cleanly.
    if (sent) c->goodbye_nowait();
    throw TimeoutError("store " + what + " got no reply from the rendezvous store at " + endpoint() +
                       " (rank 0) in time");
  } catch (const IoLost& e) {
    c.reset();
    lost(e.why);
  }
  release(std::move(c));
  return body;
}

void TcpStore::lost(const std::string& why) {
  std::string reason;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (state_ == State::kOpen) {
      state_ = State::kLost;
      lost_reason_ = why + " (did rank 0 exit?)";
      idle_.clear();
      stop_cv_.notify_all();
    }
    reason = state_ == State::kLost ? lost_reason_ : why;
  }
  throw Error("the rendezvous store at " + endpoint() + " (rank 0) is unreachable: " + reason);
}

std::string TcpStore::dead_ranks_note() {
  try {
    std::vector<int> dead = dead_ranks();
    if (dead.empty()) return "";
    std::string s = "; ranks that died: ";
    for (size_t i = 0; i < dead.size() && i < 16; ++i) s += (i ? ", " : "") + std::to_string(dead[i]);
    if (dead.size() > 16) s += ", ...";
    return s;
  } catch (...) {
    return "";
  }
}

void TcpStore::close() {
  std::vector<std::unique_ptr<Conn>> conns;
  {
    std::lock_guard<std::mutex> lock(mu_);
    conns.swap(idle_);
    state_ = State::kClosed;
  }
  stop_keep_alive();
  // In a forked child the sockets are the parent's: close our copies silently.
  if (getpid() != pid_) return;
  for (auto& c : conns) c->goodbye(timeout_);
}

void TcpStore::set(const std::string& key, const std::vector<uint8_t>& value) {
  check_key(key, "set");
  if (value.size() > proto::kMaxValueSize) {
    throw InvalidArgument("TcpStore.set: value of " + std::to_string(value.size()) +
                          " bytes is larger than the limit of " + std::to_string(proto::kMaxValueSize));
  }
  std::string frame =
      proto::Writer(key.size() + value.size() + 16).u8(proto::kSet).str(key).str(value.data(), value.size()).finish();
  std::string body = roundtrip(frame, Clock::now() + timeout_, "set of key '" + key + "'");
  proto::Reader r(body.data(), body.size());
  uint8_t status = r.u8();
  if (status == proto::kError) throw Error("TcpStore." + r.str(1 << 20));  // refused: written once, or full
  if (status != proto::kOk || !r.ok()) lost("protocol error (bad reply to set)");
}

std::vector<uint8_t> TcpStore::get(const std::string& key, milliseconds timeout) {
  check_key(key, "get");
  timeout = clamp_timeout(timeout, "get");
  std::string frame = proto::Writer().u8(proto::kGet).str(key).i64(timeout.count()).finish();
  std::string what = "get of key '" + key + "'";
  std::string body = roundtrip(frame, Clock::now() + timeout + kReplyGrace, what);
  proto::Reader r(body.data(), body.size());
  uint8_t status = r.u8();
  if (status == proto::kTimeout) {
    throw TimeoutError("store " + what + " timed out after " + seconds_str(timeout) + ": no rank set it (store at " +
                       endpoint() + ")" + dead_ranks_note());
  }
  std::string value = r.str(proto::kMaxValueSize);
  if (status != proto::kOk || !r.ok()) lost("protocol error (bad reply to get)");
  return std::vector<uint8_t>(value.begin(), value.end());
}

int64_t TcpStore::add(const std::string& key, int64_t delta) {
  check_key(key, "add");
  std::string frame = proto::Writer().u8(proto::kAdd).str(key).i64(delta).finish();
  std::string body = roundtrip(frame, Clock::now() + timeout_, "add to key '" + key + "'");
  proto::Reader r(body.data(), body.size());
  uint8_t status = r.u8();
  if (status == proto::kError) throw Error("TcpStore." + r.str(1 << 20));
  int64_t v = r.i64();
  if (status != proto::kOk || !r.ok()) lost("protocol error (bad reply to add)");
  return v;
}

void TcpStore::wait(const std::vector<std::string>& keys, milliseconds timeout) {
  check_keys(keys, "wait");
  timeout = clamp_timeout(timeout, "wait");
  proto::Writer w;
  w.u8(proto::kWait).u32(uint32_t(keys.size()));
  for (const auto& k : keys) w.str(k);
  std::string frame = w.i64(timeout.count()).finish();
  std::string what = "wait for " + quote_keys(keys);
  std::string body = roundtrip(frame, Clock::now() + timeout + kReplyGrace, what);
  uint8_t status = body.empty() ? 255 : uint8_t(body[0]);
  if (status == proto::kTimeout) {
    throw TimeoutError("store " + what + " timed out after " + seconds_str(timeout) + " (store at " + endpoint() + ")" +
                       dead_ranks_note());
  }
  if (status != proto::kOk) lost("protocol error (bad reply to wait)");
}

bool TcpStore::check(const std::vector<std::string>& keys) {
  check_keys(keys, "check");
  proto::Writer w;
  w.u8(proto::kCheck).u32(uint32_t(keys.size()));
  for (const auto& k : keys) w.str(k);
  std::string frame = w.finish();
  std::string body = roundtrip(frame, Clock::now() + timeout_, "check of " + quote_keys(keys));
  proto::Reader r(body.data(), body.size());
  uint8_t status = r.u8();
  uint8_t all = r.u8();
  if (status != proto::kOk || !r.ok()) lost("protocol error (bad reply to check)");
  return all != 0;
}

std::vector<int> TcpStore::dead_ranks() {
  std::string frame = proto::Writer().u8(proto::kDeadRanks).finish();
  std::string body = roundtrip(frame, Clock::now() + timeout_, "dead_ranks");
  proto::Reader r(body.data(), body.size());
  uint8_t status = r.u8();
  uint32_t n = r.u32();
  if (status != proto::kOk || !r.ok() || n > proto::kMaxRanks) lost("protocol error (bad reply to dead_ranks)");
  std::vector<int> ranks;
  ranks.reserve(n);
  for (uint32_t i = 0; i < n; ++i) ranks.push_back(r.i32());
  if (!r.ok()) lost("protocol error (bad reply to dead_ranks)");
  return ranks;
}

}  // namespace bagua
