// Client of TcpStoreServer: the rendezvous store every rank uses.
#pragma once

#include <chrono>
#include <mutex>
#include <string>
#include <vector>

#include "store/store.h"

namespace bagua {

class TcpStore : public Store {
 public:
  // Connects to the server at host:port, retrying until `timeout` (the server
  // may start after its clients). `rank` identifies this process for liveness
  // (dead_ranks); -1 for a client that is not a rank. `timeout` is also the
  // default of every later blocking call. Throws TimeoutError if no server
  // answers in time.
  TcpStore(const std::string& host, int port, int rank, std::chrono::milliseconds timeout);
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
  // idempotent. Later calls throw bagua::Error.
  void close();

  const std::string& host() const { return host_; }
  int port() const { return port_; }
  int rank() const { return rank_; }

 private:
  using Clock = std::chrono::steady_clock;
  enum class State { kConnected, kResync, kLost, kClosed };

  void connect_locked(Clock::time_point deadline);
  // Sends one request and returns the reply body; `reply_deadline` bounds the
  // wait for the reply. Caller holds mu_.
  std::string roundtrip_locked(const std::string& frame, Clock::time_point reply_deadline,
                               const std::string& what);
  void send_all_locked(const std::string& data, Clock::time_point deadline, const std::string& what);
  void recv_all_locked(char* dst, size_t n, Clock::time_point deadline, const std::string& what);
  void ensure_connected_locked();
  void disconnect_locked(bool say_goodbye);
  [[noreturn]] void lost_locked(const std::string& why);
  std::string endpoint() const;

  const std::string host_;
  const int port_;
  const int rank_;
  const std::chrono::milliseconds timeout_;

  std::mutex mu_;
  int fd_ = -1;
  State state_ = State::kClosed;
  std::string lost_reason_;
};

}  // namespace bagua
