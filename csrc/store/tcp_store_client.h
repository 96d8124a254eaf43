// Client of TcpStoreServer: the rendezvous store every rank uses.
#pragma once

#include <chrono>
#include <condition_variable>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "store/store.h"

namespace bagua {

// The server closes authenticated connections that stay silent for its idle
// timeout (it says how long when this client authenticates); a background
// thread pings every pooled connection well within that bound, so a rank may
// stay quiet between rendezvous for as long as it likes. A pooled connection
// that was closed anyway (the process was frozen meanwhile) is replaced once,
// transparently, before a request is given up as lost.
class TcpStore : public Store {
 public:
  // Connects to the server at host:port, retrying until `timeout` (the server
  // may start after its clients). `rank` identifies this process for liveness
  // (dead_ranks); -1 for a client that is not a rank. `timeout` is also the
  // default of every later blocking call. Throws TimeoutError if no server
  // answers in time. `secret` is the job's secret the server checks (see
  // TcpStoreServerOptions::secret); a server that refuses it raises Error.
  // A positive `connect_timeout` bounds the first connection instead (short
  // attempts, e.g. to keep Ctrl-C responsive while the server is not up).
  TcpStore(const std::string& host, int port, int rank, std::chrono::milliseconds timeout, std::string secret = "",
           std::chrono::milliseconds connect_timeout = std::chrono::milliseconds::zero());
  ~TcpStore() override;  // close()

  TcpStore(const TcpStore&) = delete;
  TcpStore& operator=(const TcpStore&) = delete;

  void set(const std::string& key, const std::vector<uint8_t>& value) override;
  std::vector<uint8_t> get(const std::string& key, std::chrono::milliseconds timeout) override;
  std::vector<uint8_t> get(const std::string& key) { return get(key, timeout_); }
  int64_t add(const std::string& key, int64_t delta) override;
  void wait(const std::vector<std::string>& keys, std::chrono::milliseconds timeout) override;
  void wait(const std::vector<std::string>& keys) { wait(keys, timeout_); }
  bool check(const std::vector<std::string>& keys) override;
  std::chrono::milliseconds timeout() const override { return timeout_; }
  std::vector<int> dead_ranks() override;

  // Says goodbye (so this rank is not reported dead) and disconnects;
  // idempotent. Later calls throw bagua::Error. A call blocked in another
  // thread keeps its connection until it returns.
  void close();

  const std::string& host() const { return host_; }
  int port() const { return port_; }
  int rank() const { return rank_; }

 private:
  using Clock = std::chrono::steady_clock;
  struct Conn;  // one socket to the server, used by one call at a time

  // Sends one request on a free connection (opening one if all are busy, so
  // a blocked get in one thread does not hold up another thread) and returns
  // the reply body. `reply_deadline` bounds the wait for the reply.
  std::string roundtrip(const std::string& frame, Clock::time_point reply_deadline, const std::string& what);
  std::unique_ptr<Conn> open_conn(Clock::time_point deadline, bool retry);
  void keep_alive_loop(std::chrono::milliseconds every);
  void stop_keep_alive();
  std::unique_ptr<Conn> acquire();
  void release(std::unique_ptr<Conn> c);
  [[noreturn]] void lost(const std::string& why);
  void check_fork() const;
  std::string dead_ranks_note();  // "; ranks that died: ..." or ""
  std::string endpoint() const;

  const std::string host_;
  const int port_;
  const int rank_;
  const std::chrono::milliseconds timeout_;
  const std::string secret_;
  const int pid_;  // a forked child must not touch the parent's sockets

  std::mutex mu_;
  std::condition_variable stop_cv_;
  std::vector<std::unique_ptr<Conn>> idle_;
  // Pings idle connections; started once the server names its idle timeout.
  // A pointer, so that a forked child can leave the parent's thread alone.
  std::unique_ptr<std::thread> keep_alive_;
  enum class State { kOpen, kLost, kClosed } state_ = State::kOpen;
  std::string lost_reason_;
};

}  // namespace bagua
