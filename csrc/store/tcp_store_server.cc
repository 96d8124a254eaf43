#include "store/tcp_store_server.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/eventfd.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <climits>
#include <cstring>
#include <map>
#include <thread>
#include <unordered_map>
#include <vector>

#include "common/error.h"
#include "store/tcp_store_handshake.h"
#include "store/tcp_store_liveness.h"
#include "store/tcp_store_protocol.h"
#include "store/tcp_store_table.h"

namespace bagua {

namespace proto = store_protocol;
using Clock = LivenessClock;

namespace {

constexpr size_t kReadChunk = 64 * 1024;
constexpr size_t kMaxReadChunk = 8 << 20;
// Input buffered per connection: one whole frame plus a read chunk. Beyond
// that the connection is not read until its pending request completes.
constexpr size_t kMaxBuffered = proto::kMaxFrameSize + 4 + kReadChunk;

std::string endpoint(const std::string& host, int port) {
  if (host.find(':') != std::string::npos) return "[" + host + "]:" + std::to_string(port);
  return host + ":" + std::to_string(port);
}

struct Conn {
  explicit Conn(Clock::time_point accepted) : clocks(accepted) {}
  int fd = -1;
  uint64_t id = 0;
  std::string in;     // received, not yet processed
  size_t in_off = 0;  // processed prefix of `in`
  std::string out;    // replies not yet sent
  size_t out_off = 0;
  bool hello = false;         // authenticated: may make requests
  ServerHandshake handshake;  // until `hello`; names the client's rank
  bool goodbye = false;       // said goodbye: closes cleanly after the reply
  bool closed = false;        // to be removed at the end of the loop iteration
  ConnLiveness clocks;        // store/tcp_store_liveness.h

  enum class Pending { kNone, kGet, kWait } pending = Pending::kNone;
  std::vector<std::string> pending_keys;

  size_t buffered() const { return in.size() - in_off; }
  ConnActivity activity() const { return {hello, pending != Pending::kNone, has_output()}; }
  // Input buffered at most: a whole frame once authenticated, a tiny one before.
  size_t max_buffered() const { return hello ? kMaxBuffered : proto::kMaxHandshakeFrame + 4; }
  bool has_output() const { return out_off < out.size(); }
};

}  // namespace

struct TcpStoreServer::Impl {
  std::string host;
  int port = 0;
  TcpStoreServerOptions options;
  int listen_fd = -1;
  int wake_fd = -1;
  std::thread thread;
  bool closed = false;
  pid_t pid = getpid();  // the process whose thread serves

  // Owned by the server thread only.
  std::map<uint64_t, std::unique_ptr<Conn>> conns;
  uint64_t next_id = 1;
  std::unique_ptr<StoreTable> data;  // made with the options
  // key -> connections whose pending get/wait is blocked on that key.
  std::unordered_map<std::string, std::vector<uint64_t>> waiters;
  std::vector<uint64_t> ready;              // connections that may process more input
  std::unique_ptr<StoreLiveness> liveness;  // made with the options; holds the dead ranks
  size_t max_connections = 0;               // options.max_connections within the descriptor limit
  Clock::time_point accept_paused_until{};

  void listen_on(const std::string& h, int p);
  void run();
  void accept_all();
  void read_from(Conn& c);
  void flush(Conn& c);
  void process(Conn& c);
  bool handle(Conn& c, const char* body, size_t size);
  bool handshake(Conn& c, uint8_t op, proto::Reader& r);
  void reply(Conn& c, std::string frame);
  void reply_status(Conn& c, proto::Status s) { reply(c, proto::Writer().u8(s).finish()); }
  void reply_error(Conn& c, const std::string& msg) { reply(c, proto::Writer().u8(proto::kError).str(msg).finish()); }
  bool try_complete(Conn& c);  // completes c's pending request if it can
  void wake(const std::string& key);
  void drop(Conn& c);  // closes c; dirty unless it said goodbye
  void check_timers(Clock::time_point now);
  void process_ready() {
    while (!ready.empty()) {
      uint64_t id = ready.back();
      ready.pop_back();
      auto it = conns.find(id);
      if (it != conns.end() && !it->second->closed) guarded(*it->second, [&] { process(*it->second); });
    }
  }
  // Failures while serving one client (e.g. out of memory for its message)
  // cost that client its connection, never the server thread.
  template <typename F>
  void guarded(Conn& c, F&& f) {
    try {
      f();
    } catch (const std::exception&) {
      drop(c);
    }
  }
  int poll_timeout_ms(Clock::time_point now) const;
};

void TcpStoreServer::Impl::listen_on(const std::string& h, int p) {
  if (h.empty()) throw InvalidArgument("TcpStoreServer: host must not be empty (give MASTER_ADDR)");
  if (p < 0 || p > 65535) throw InvalidArgument("TcpStoreServer: port " + std::to_string(p) + " is out of range");
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* res = nullptr;
  int rc = getaddrinfo(h.c_str(), std::to_string(p).c_str(), &hints, &res);
  if (rc != 0) {
    throw Error("TcpStoreServer: cannot resolve host '" + h + "': " + gai_strerror(rc));
  }
  int last_errno = 0;
  for (addrinfo* ai = res; ai; ai = ai->ai_next) {
    int fd = socket(ai->ai_family, ai->ai_socktype | SOCK_NONBLOCK | SOCK_CLOEXEC, ai->ai_protocol);
    if (fd < 0) {
      last_errno = errno;
      continue;
    }
    int one = 1;
    setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
    if (bind(fd, ai->ai_addr, ai->ai_addrlen) == 0 && ::listen(fd, SOMAXCONN) == 0) {
      sockaddr_storage ss{};
      socklen_t len = sizeof(ss);
      getsockname(fd, reinterpret_cast<sockaddr*>(&ss), &len);
      port = ntohs(ss.ss_family == AF_INET6 ? reinterpret_cast<sockaddr_in6*>(&ss)->sin6_port
                                            : reinterpret_cast<sockaddr_in*>(&ss)->sin_port);
      listen_fd = fd;
      break;
    }
    last_errno = errno;
    ::close(fd);
  }
  freeaddrinfo(res);
  if (listen_fd < 0) {
    std::string msg = "TcpStoreServer: cannot listen on " + endpoint(h, p) + ": " + std::strerror(last_errno);
    if (last_errno == EADDRINUSE) {
      msg += " (the port is taken; set BAGUA_STORE_PORT to choose another store port)";
    } else if (last_errno == EADDRNOTAVAIL) {
      msg += " (the address is not one of this host's; check MASTER_ADDR)";
    }
    throw Error(msg);
  }
}

TcpStoreServer::TcpStoreServer(const std::string& host, int port, TcpStoreServerOptions options) : impl_(new Impl) {
  impl_->host = host;
  impl_->options = options;
  impl_->data = std::make_unique<StoreTable>(options.max_value_bytes, options.max_total_bytes);
  impl_->liveness = std::make_unique<StoreLiveness>(options.io_timeout, options.idle_timeout);
  impl_->max_connections = options.max_connections;
  rlimit limit{};
  if (getrlimit(RLIMIT_NOFILE, &limit) == 0 && limit.rlim_cur != RLIM_INFINITY)
    impl_->max_connections = std::min<size_t>(impl_->max_connections, std::max<size_t>(8, limit.rlim_cur / 2));
  impl_->listen_on(host, port);
  impl_->wake_fd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
  if (impl_->wake_fd < 0) {
    ::close(impl_->listen_fd);
    throw Error(std::string("TcpStoreServer: eventfd failed: ") + std::strerror(errno));
  }
  impl_->thread = std::thread([this] { impl_->run(); });
}

TcpStoreServer::~TcpStoreServer() { close(); }

const std::string& TcpStoreServer::host() const { return impl_->host; }
int TcpStoreServer::port() const { return impl_->port; }

void TcpStoreServer::close() {
  if (!impl_ || impl_->closed) return;
  if (getpid() != impl_->pid) {
    // A forked child: the serving thread and the sockets belong to the
    // parent. Waking or joining would stop or corrupt the parent's server,
    // and destroying a joinable std::thread would abort, so let it be.
    (void)impl_.release();
    return;
  }
  impl_->closed = true;
  uint64_t one = 1;
  ssize_t n = write(impl_->wake_fd, &one, sizeof(one));
  (void)n;
  if (impl_->thread.joinable()) impl_->thread.join();
  for (auto& kv : impl_->conns)
    if (kv.second->fd >= 0) ::close(kv.second->fd);
  impl_->conns.clear();
  ::close(impl_->listen_fd);
  ::close(impl_->wake_fd);
}

void TcpStoreServer::Impl::run() {
  std::vector<pollfd> fds;
  std::vector<Conn*> polled;
  for (;;) {
    try {
      auto now = Clock::now();
      fds.clear();
      polled.clear();
      fds.push_back({wake_fd, POLLIN, 0});
      bool accepting = now >= accept_paused_until;
      fds.push_back({accepting ? listen_fd : -1, POLLIN, 0});
      for (auto& kv : conns) {
        Conn& c = *kv.second;
        short ev = POLLRDHUP;
        if (c.buffered() < c.max_buffered()) ev |= POLLIN;
        if (c.has_output()) ev |= POLLOUT;
        fds.push_back({c.fd, ev, 0});
        polled.push_back(&c);
      }
      int n = ::poll(fds.data(), fds.size(), poll_timeout_ms(now));
      if (n < 0 && errno != EINTR) n = 0;  // nothing sensible to do but retry
      if (fds[0].revents) return;          // close() asked us to stop
      if (fds[1].revents) accept_all();
      for (size_t i = 0; i < polled.size(); ++i) {
        Conn& c = *polled[i];
        short re = fds[i + 2].revents;
        if (!re || c.closed) continue;
        guarded(c, [&] {
          if (re & POLLOUT) flush(c);
          if (!c.closed && (re & (POLLIN | POLLRDHUP | POLLHUP | POLLERR))) read_from(c);
          if (!c.closed) process(c);
        });
      }
      // Requests woken by a set may have more input queued behind them.
      process_ready();
      check_timers(Clock::now());
      process_ready();
      for (auto it = conns.begin(); it != conns.end();) {
        if (it->second->closed) {
          if (it->second->fd >= 0) ::close(it->second->fd);
          it = conns.erase(it);
        } else {
          ++it;
        }
      }
    } catch (const std::exception&) {
      // Out of memory or descriptors outside any one client: back off, keep serving.
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
  }
}

// Wakes for the earliest liveness deadline or the end of an accept pause, and
// at least once a second.
int TcpStoreServer::Impl::poll_timeout_ms(Clock::time_point now) const {
  auto next = now + std::chrono::seconds(1);
  if (now < accept_paused_until) next = std::min(next, accept_paused_until);
  for (auto& kv : conns) next = std::min(next, liveness->next_check(kv.second->clocks, kv.second->activity()));
  auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(next - now).count() + 1;
  return int(std::max<int64_t>(0, ms));
}

void TcpStoreServer::Impl::accept_all() {
  for (;;) {
    int fd = accept4(listen_fd, nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC);
    if (fd < 0) {
      if (errno == EMFILE || errno == ENFILE || errno == ENOBUFS || errno == ENOMEM) {
        // Out of descriptors: stop accepting for a moment instead of spinning.
        accept_paused_until = Clock::now() + std::chrono::milliseconds(100);
      }
      return;  // EAGAIN, or a connection that vanished before accept
    }
    // Handshakes beyond the cap evict the oldest one: a stranger holding
    // connections open cannot lock the ranks out, whose handshakes take a
    // round trip.
    Conn* oldest = nullptr;
    size_t handshakes = 0;
    for (auto& kv : conns) {
      Conn& o = *kv.second;
      if (o.hello || o.closed) continue;
      ++handshakes;
      if (!oldest || o.clocks.accepted() < oldest->clocks.accepted()) oldest = &o;
    }
    if (oldest && handshakes >= options.max_handshakes) {
      // Its descriptor goes now, not at the end of the loop iteration: a burst
      // of strangers must not hold a descriptor each until the burst ends.
      drop(*oldest);
      ::close(oldest->fd);
      oldest->fd = -1;
    }
    if (conns.size() >= max_connections) {
      ::close(fd);
      continue;
    }
    int one = 1, idle = 30, interval = 5, count = 6;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
    // A client whose host vanishes (no FIN, no RST) is noticed within about a
    // minute and reported dead.
    setsockopt(fd, SOL_SOCKET, SO_KEEPALIVE, &one, sizeof(one));
    setsockopt(fd, IPPROTO_TCP, TCP_KEEPIDLE, &idle, sizeof(idle));
    setsockopt(fd, IPPROTO_TCP, TCP_KEEPINTVL, &interval, sizeof(interval));
    setsockopt(fd, IPPROTO_TCP, TCP_KEEPCNT, &count, sizeof(count));
    auto c = std::make_unique<Conn>(Clock::now());
    c->fd = fd;
    c->id = next_id++;
    conns.emplace(c->id, std::move(c));
  }
}

void TcpStoreServer::Impl::read_from(Conn& c) {
  // Compact the processed prefix before reading more.
  if (c.in_off > 0 && (c.in_off == c.in.size() || c.in_off > kReadChunk)) {
    c.in.erase(0, c.in_off);
    c.in_off = 0;
  }
  while (c.buffered() < c.max_buffered()) {
    size_t at = c.in.size();
    // Read a large message in large pieces: fewer wake-ups on a busy host.
    size_t want = kReadChunk;
    if (c.buffered() >= 4 && c.pending == Conn::Pending::kNone) {
      size_t frame_end = 4 + size_t(proto::frame_length(&c.in[c.in_off]));
      if (frame_end > c.buffered()) want = std::clamp(frame_end - c.buffered(), kReadChunk, kMaxReadChunk);
    }
    want = std::min(want, c.max_buffered() - c.buffered());
    c.in.resize(at + want);
    ssize_t n = ::recv(c.fd, &c.in[at], want, 0);
    if (n > 0) {
      c.in.resize(at + size_t(n));
      c.clocks.received(Clock::now());
      continue;  // until EAGAIN
    }
    c.in.resize(at);
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return;
    if (n < 0 && errno == EINTR) continue;
    // End of stream or a reset. A goodbye still queued behind a pending
    // request counts as a clean close.
    size_t off = c.in_off;
    while (!c.goodbye && c.in.size() - off >= 5) {
      uint32_t len = proto::frame_length(&c.in[off]);
      if (len == 0 || c.in.size() - off - 4 < len) break;
      if (uint8_t(c.in[off + 4]) == proto::kGoodbye) c.goodbye = true;
      off += 4 + len;
    }
    drop(c);
    return;
  }
}

void TcpStoreServer::Impl::flush(Conn& c) {
  while (c.has_output()) {
    ssize_t n = ::send(c.fd, c.out.data() + c.out_off, c.out.size() - c.out_off, MSG_NOSIGNAL | MSG_DONTWAIT);
    if (n > 0) {
      c.out_off += size_t(n);
      c.clocks.sent(Clock::now());
      continue;
    }
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return;
    drop(c);
    return;
  }
  c.out.clear();
  c.out_off = 0;
  c.clocks.drained(Clock::now());
  if (c.goodbye) drop(c);
}

void TcpStoreServer::Impl::reply(Conn& c, std::string frame) {
  if (!c.has_output()) {
    c.out = std::move(frame);
    c.out_off = 0;
    c.clocks.sent(Clock::now());
  } else {
    c.out += frame;
  }
  flush(c);
}

void TcpStoreServer::Impl::process(Conn& c) {
  // One request at a time per connection, and only once the previous reply
  // is sent: a client that does not read cannot make the server buffer more.
  while (!c.closed && c.pending == Conn::Pending::kNone && !c.has_output() && !c.goodbye) {
    size_t avail = c.buffered();
    uint32_t len = avail >= 4 ? proto::frame_length(&c.in[c.in_off]) : 0;
    const size_t max_len = c.hello ? proto::kMaxFrameSize : proto::kMaxHandshakeFrame;
    if (avail >= 4 && (len == 0 || len > max_len)) {
      drop(c);  // garbage or an oversized message
      return;
    }
    if (avail < 4 || avail - 4 < len) {
      c.clocks.unfinished(avail, Clock::now());  // must finish within io_timeout
      return;
    }
    c.clocks.framed();
    const char* body = &c.in[c.in_off + 4];
    c.in_off += 4 + len;
    if (!handle(c, body, len)) {
      drop(c);
      return;
    }
    if (c.in_off == c.in.size()) {
      c.in.clear();
      c.in_off = 0;
    }
  }
}

// Returns false when the request is malformed (the caller drops the client).
bool TcpStoreServer::Impl::handle(Conn& c, const char* body, size_t size) {
  proto::Reader r(body, size);
  uint8_t op = r.u8();
  if (!c.hello) return handshake(c, op, r);
  switch (op) {
    case proto::kSet: {
      std::string key = r.str(proto::kMaxKeySize);
      std::string value = r.str(proto::kMaxValueSize);
      if (!r.ok() || !r.at_end()) return false;
      StoreTable::SetResult set = data->set(key, std::move(value));
      if (!set.error.empty()) {
        reply_error(c, set.error);
        return true;
      }
      reply_status(c, proto::kOk);
      if (set.stored) wake(key);
      return true;
    }
    case proto::kGet:
    case proto::kWait: {
      std::vector<std::string> keys;
      if (op == proto::kGet) {
        keys.push_back(r.str(proto::kMaxKeySize));
      } else {
        uint32_t n = r.u32();
        if (n > proto::kMaxKeysPerRequest) return false;
        for (uint32_t i = 0; i < n && r.ok(); ++i) keys.push_back(r.str(proto::kMaxKeySize));
      }
      int64_t timeout_ms = r.i64();
      if (!r.ok() || !r.at_end() || timeout_ms < 0) return false;
      c.pending = op == proto::kGet ? Conn::Pending::kGet : Conn::Pending::kWait;
      c.pending_keys = std::move(keys);
      c.clocks.blocked(Clock::now(), timeout_ms);
      try_complete(c);
      return true;
    }
    case proto::kAdd: {
      std::string key = r.str(proto::kMaxKeySize);
      int64_t delta = r.i64();
      if (!r.ok() || !r.at_end()) return false;
      int64_t result = 0;
      const std::string error = data->add(key, delta, &result);
      if (!error.empty()) {
        reply_error(c, error);
        return true;
      }
      reply(c, proto::Writer().u8(proto::kOk).i64(result).finish());
      wake(key);
      return true;
    }
    case proto::kCheck: {
      uint32_t n = r.u32();
      if (n > proto::kMaxKeysPerRequest) return false;
      bool all = true;
      for (uint32_t i = 0; i < n && r.ok(); ++i) {
        std::string key = r.str(proto::kMaxKeySize);
        if (!data->contains(key)) all = false;
      }
      if (!r.ok() || !r.at_end()) return false;
      reply(c, proto::Writer().u8(proto::kOk).u8(all ? 1 : 0).finish());
      return true;
    }
    case proto::kDeadRanks: {
      if (!r.at_end()) return false;
      proto::Writer w;
      w.u8(proto::kOk).u32(uint32_t(liveness->dead().size()));
      for (int d : liveness->dead()) w.i32(d);
      reply(c, w.finish());
      return true;
    }
    case proto::kPing: {
      if (!r.at_end()) return false;
      reply_status(c, proto::kOk);
      return true;
    }
    case proto::kGoodbye: {
      if (!r.at_end()) return false;
      c.goodbye = true;
      reply_status(c, proto::kOk);  // flush() closes once it is sent
      return true;
    }
    default: return false;
  }
}

// Steps the connection's handshake (store/tcp_store_handshake.h).
bool TcpStoreServer::Impl::handshake(Conn& c, uint8_t op, proto::Reader& r) {
  ServerHandshake::Step step = c.handshake.step(op, r, options.secret, options.idle_timeout.count());
  switch (step.outcome) {
    case ServerHandshake::Outcome::kMalformed: return false;
    case ServerHandshake::Outcome::kChallenged: reply(c, std::move(step.reply)); return true;
    case ServerHandshake::Outcome::kRefused:
      reply(c, std::move(step.reply));
      c.goodbye = true;  // a stranger or another Bagua, not a rank that died
      if (!c.has_output()) drop(c);
      return true;
    case ServerHandshake::Outcome::kAuthenticated:
      c.hello = true;
      liveness->authenticated(c.handshake.rank());  // a rank that reconnects is alive again
      reply(c, std::move(step.reply));
      return true;
  }
  return false;
}

bool TcpStoreServer::Impl::try_complete(Conn& c) {
  if (c.pending == Conn::Pending::kGet) {
    const std::string* value = data->find(c.pending_keys[0]);
    if (!value) {
      waiters[c.pending_keys[0]].push_back(c.id);
      return false;
    }
    c.pending = Conn::Pending::kNone;
    c.pending_keys.clear();
    reply(c, proto::Writer(value->size() + 8).u8(proto::kOk).str(*value).finish());
    return true;
  }
  if (c.pending == Conn::Pending::kWait) {
    for (const auto& k : c.pending_keys) {
      if (!data->contains(k)) {
        waiters[k].push_back(c.id);  // re-checked when k is set
        return false;
      }
    }
    c.pending = Conn::Pending::kNone;
    c.pending_keys.clear();
    reply_status(c, proto::kOk);
    return true;
  }
  return false;
}

void TcpStoreServer::Impl::wake(const std::string& key) {
  auto it = waiters.find(key);
  if (it == waiters.end()) return;
  std::vector<uint64_t> ids = std::move(it->second);
  waiters.erase(it);
  for (uint64_t id : ids) {
    auto ci = conns.find(id);
    if (ci == conns.end()) continue;
    Conn& c = *ci->second;
    if (c.closed || c.pending == Conn::Pending::kNone) continue;
    // Stale entries (a request that already timed out) name other keys.
    if (std::find(c.pending_keys.begin(), c.pending_keys.end(), key) == c.pending_keys.end()) continue;
    if (try_complete(c)) ready.push_back(id);
  }
}

void TcpStoreServer::Impl::check_timers(Clock::time_point now) {
  for (auto& kv : conns) {
    Conn& c = *kv.second;
    if (c.closed) continue;
    switch (liveness->check(c.clocks, c.activity(), now)) {
      case StoreLiveness::Verdict::kKeep: break;
      case StoreLiveness::Verdict::kPendingExpired:
        c.pending = Conn::Pending::kNone;
        c.pending_keys.clear();
        reply_status(c, proto::kTimeout);
        ready.push_back(c.id);
        break;
      case StoreLiveness::Verdict::kStalled: drop(c); break;
      case StoreLiveness::Verdict::kIdle:
        c.goodbye = true;  // a clean close: its rank is not dead
        drop(c);
        break;
    }
  }
  // Forget waiter lists whose connections are all gone.
  if (waiters.size() > 1024) {
    for (auto it = waiters.begin(); it != waiters.end();) {
      auto& v = it->second;
      v.erase(std::remove_if(v.begin(), v.end(),
                             [&](uint64_t id) {
                               auto ci = conns.find(id);
                               return ci == conns.end() || ci->second->closed ||
                                      ci->second->pending == Conn::Pending::kNone;
                             }),
              v.end());
      it = v.empty() ? waiters.erase(it) : std::next(it);
    }
  }
}

void TcpStoreServer::Impl::drop(Conn& c) {
  if (c.closed) return;
  c.closed = true;
  c.pending = Conn::Pending::kNone;
  c.pending_keys.clear();
  liveness->closed(c.handshake.rank(), c.hello, c.goodbye);
  ::shutdown(c.fd, SHUT_RDWR);
}

}  // namespace bagua
