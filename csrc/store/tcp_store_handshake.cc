#include "store/tcp_store_handshake.h"

#include <sys/random.h>

#include <cstring>

#include "common/sha256.h"

namespace bagua {

namespace proto = store_protocol;

ServerHandshake::Step ServerHandshake::step(uint8_t op, proto::Reader& r, const std::string& secret,
                                            int64_t idle_timeout_ms) {
  const Step malformed{Outcome::kMalformed, {}};
  if (!challenged_) {
    if (op != proto::kHello) return malformed;  // not a Bagua store client
    uint32_t magic = r.u32();
    uint32_t version = r.u32();
    int32_t rank = r.i32();
    if (!r.ok() || !r.at_end() || magic != proto::kMagic) return malformed;
    if (version != proto::kVersion) {
      return {Outcome::kRefused,
              proto::Writer()
                  .u8(proto::kError)
                  .str("store protocol version " + std::to_string(version) + " is not supported (server speaks " +
                       std::to_string(proto::kVersion) + "); all ranks must run the same Bagua")
                  .finish()};
    }
    nonce_.assign(proto::kNonceSize, '\0');
    if (getrandom(&nonce_[0], nonce_.size(), 0) != ssize_t(nonce_.size())) return malformed;
    challenged_ = true;
    rank_ = rank;
    return {Outcome::kChallenged, proto::Writer().u8(proto::kOk).u32(proto::kMagic).str(nonce_).finish()};
  }
  if (op != proto::kAuth) return malformed;
  std::string mac = r.str(proto::kMacSize);
  if (!r.ok() || !r.at_end() || mac.size() != proto::kMacSize) return malformed;
  const std::string message = proto::auth_message(nonce_, rank_);
  Digest want = hmac_sha256(secret, message.data(), message.size());
  Digest got;
  std::memcpy(got.data(), mac.data(), got.size());
  if (!digests_equal(want, got)) {
    return {Outcome::kRefused,
            proto::Writer()
                .u8(proto::kError)
                .str("authentication failed: this client does not hold the job's secret (BAGUA_STORE_SECRET "
                     "must be the same on every rank)")
                .finish()};
  }
  return {Outcome::kAuthenticated, proto::Writer().u8(proto::kOk).i64(idle_timeout_ms).finish()};
}

}  // namespace bagua
