// The TCP store server's side of a connection's handshake: hello (magic,
// protocol version, rank) -> a fresh nonce; auth (HMAC-SHA256 of the nonce and
// the rank under the job's secret) -> the client may make requests, and is told
// the server's idle timeout. Anything else, or a wrong proof, ends the
// connection without marking any rank dead. Pure: the caller owns the socket
// and sends the replies; one ServerHandshake per connection.
#pragma once

#include <cstdint>
#include <string>

#include "store/tcp_store_protocol.h"

namespace bagua {

class ServerHandshake {
 public:
  // What the server does with one handshake frame.
  enum class Outcome {
    kMalformed,      // not a Bagua store client, or a bad frame: drop the connection
    kChallenged,     // send `reply` (the nonce); the proof is owed next
    kRefused,        // send `reply` (an error), then close cleanly: no rank died
    kAuthenticated,  // send `reply`; the client may make requests as rank()
  };
  struct Step {
    Outcome outcome;
    std::string reply;  // a whole frame; empty for kMalformed
  };

  // `secret`: the job's secret (empty: any client that speaks the protocol);
  // `idle_timeout_ms` is told to the client once it authenticates.
  Step step(uint8_t op, store_protocol::Reader& r, const std::string& secret, int64_t idle_timeout_ms);

  // The rank the client said hello as; -1 before.
  int rank() const { return rank_; }

 private:
  bool challenged_ = false;  // said hello, was sent `nonce_`, owes the proof
  std::string nonce_;
  int rank_ = -1;
};

}  // namespace bagua
