// TCP key-value server behind TcpStore. Rank 0 runs it in a background thread.
//
// One thread serves every connection with poll(), so a client blocked in get()
// or wait() never holds up the others. A client that sends garbage, an
// oversized or truncated message, or nothing at all, loses its own connection
// and nothing else. Clients say hello with their rank and prove they hold the
// job's secret; a connection that closes without a goodbye marks that rank
// dead (see Store::dead_ranks). An authenticated connection that goes silent
// outside a blocking request is closed after idle_timeout. Keys are written
// once (a SET of an existing key with another value is refused), so a
// rendezvous cannot be rewritten.
// This file's server runs the event loop (connections, requests, wake-ups);
// store/tcp_store_liveness.h decides when a connection is given up, when a
// blocked request times out and which ranks are dead;
// store/tcp_store_handshake.h checks a client's hello and proof, and
// store/tcp_store_table.h holds the keys under the store's quotas.
#pragma once

#include <chrono>
#include <memory>
#include <string>

namespace bagua {

struct TcpStoreServerOptions {
  // A new connection must say hello and authenticate within this time, and a
  // connection that makes no progress for this long, in the middle of sending
  // a message or while not reading its replies, is closed.
  std::chrono::milliseconds io_timeout{std::chrono::seconds(30)};
  // An authenticated connection that sends nothing for this long while it
  // has no request waiting and no reply unsent is closed (without reporting
  // its rank dead). The server tells every client this bound when it
  // authenticates; TcpStore pings its idle connections well within it, so a
  // live rank keeps its connections however long it is quiet. Zero: never.
  std::chrono::milliseconds idle_timeout{std::chrono::seconds(60)};
  // More simultaneous connections than this are refused (closed at once);
  // never more than half the process's descriptor limit (RLIMIT_NOFILE), so
  // the store cannot starve the rank that runs it.
  size_t max_connections = 16384;
  // At most this many connections may be in their handshake at once (each
  // buffers at most a tiny frame), so strangers cannot crowd out the ranks.
  size_t max_handshakes = 64;
  // The job's secret: a client proves it holds it (HMAC-SHA256 over a fresh
  // nonce and its rank) before any other request. Empty: any client that
  // speaks the protocol is accepted.
  std::string secret;
  // Largest value a SET may store, and total bytes of keys and values held.
  size_t max_value_bytes = size_t(64) << 20;
  size_t max_total_bytes = size_t(256) << 20;
};

class TcpStoreServer {
 public:
  // Listens on host (a name or address; only that address, not all
  // interfaces) and port (0 picks a free port, see port()). Throws bagua::Error
  // when it cannot listen, e.g. when the port is taken.
  TcpStoreServer(const std::string& host, int port, TcpStoreServerOptions options = {});
  ~TcpStoreServer();  // close()

  TcpStoreServer(const TcpStoreServer&) = delete;
  TcpStoreServer& operator=(const TcpStoreServer&) = delete;

  const std::string& host() const;
  int port() const;  // the bound port
  // Stops serving and closes every connection; idempotent.
  void close();

  struct Impl;

 private:
  std::unique_ptr<Impl> impl_;
};

}  // namespace bagua
