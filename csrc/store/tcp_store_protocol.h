// Wire format shared by the TCP store's server and client.
//
// Every message is a frame: a little-endian u32 body length, then the body.
// A request body starts with a u8 opcode, a response body with a u8 status.
// Fields: u8, i32, u32, i64 (little-endian) and byte strings (u32 length +
// bytes). Sizes are bounded so that a hostile peer cannot make either side
// allocate without limit.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

namespace bagua {
namespace store_protocol {

constexpr uint32_t kMagic = 0x54534742;  // "BGST"
constexpr uint32_t kVersion = 2;         // 2: challenge-response authentication

// Until it has authenticated, a client may send only tiny frames (hello, auth).
constexpr size_t kMaxHandshakeFrame = 256;
constexpr size_t kNonceSize = 32;
constexpr size_t kMacSize = 32;

constexpr size_t kMaxKeySize = 4096;
constexpr size_t kMaxValueSize = size_t(64) << 20;  // 64 MiB
constexpr size_t kMaxKeysPerRequest = 4096;
constexpr size_t kMaxRanks = 1 << 20;
// Largest frame either side accepts: a SET of the largest key and value, or a
// WAIT of the most keys, plus headers.
constexpr size_t kMaxFrameSize = kMaxValueSize + kMaxKeySize + 64;
static_assert(kMaxKeysPerRequest * (kMaxKeySize + 4) + 64 < kMaxFrameSize, "wait fits a frame");

enum Op : uint8_t {
  kHello = 1,      // u32 magic, u32 version, i32 rank      -> OK u32 magic, 32-byte nonce
  kAuth = 9,       // 32-byte HMAC-SHA256(secret, auth_message(nonce, rank)) -> OK i64 idle_timeout_ms | ERROR
  kSet = 2,        // str key, str value                    -> OK
  kGet = 3,        // str key, i64 timeout_ms               -> OK str value | TIMEOUT
  kAdd = 4,        // str key, i64 delta                    -> OK i64 | ERROR
  kWait = 5,       // u32 n, n x str key, i64 timeout_ms    -> OK | TIMEOUT
  kCheck = 6,      // u32 n, n x str key                    -> OK u8
  kDeadRanks = 7,  //                                       -> OK u32 n, n x i32
  kGoodbye = 8,    //                                       -> OK, then the server closes
  kPing = 10,      //                                       -> OK (keeps an idle connection open)
};

enum Status : uint8_t {
  kOk = 0,
  kTimeout = 1,
  kError = 2,  // str message
};

// Appends fields to a frame; finish() fills in the length prefix.
class Writer {
 public:
  explicit Writer(size_t reserve = 64) {
    buf_.reserve(reserve + 4);
    buf_.resize(4);
  }
  Writer& u8(uint8_t v) {
    buf_.push_back(char(v));
    return *this;
  }
  Writer& u32(uint32_t v) { return raw(&v, 4); }
  Writer& i32(int32_t v) { return raw(&v, 4); }
  Writer& i64(int64_t v) { return raw(&v, 8); }
  Writer& str(const void* data, size_t n) {
    u32(uint32_t(n));
    buf_.append(static_cast<const char*>(data), n);
    return *this;
  }
  Writer& str(const std::string& s) { return str(s.data(), s.size()); }
  std::string finish() {
    uint32_t n = uint32_t(buf_.size() - 4);
    put_le(&buf_[0], &n, 4);
    return std::move(buf_);
  }

 private:
  Writer& raw(const void* v, size_t n) {
    size_t at = buf_.size();
    buf_.resize(at + n);
    put_le(&buf_[at], v, n);
    return *this;
  }
  static void put_le(char* dst, const void* src, size_t n) {
    // Hosts we build for are little-endian; keep one place to change if not.
    static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__, "little-endian host assumed");
    std::memcpy(dst, src, n);
  }
  std::string buf_;
};

// Reads fields from a frame body; every read is bounds-checked and a failed
// read leaves ok() false (the caller then drops the peer).
class Reader {
 public:
  Reader(const char* data, size_t size) : p_(data), end_(data + size) {}
  bool ok() const { return ok_; }
  bool at_end() const { return p_ == end_; }
  uint8_t u8() {
    uint8_t v = 0;
    raw(&v, 1);
    return v;
  }
  uint32_t u32() {
    uint32_t v = 0;
    raw(&v, 4);
    return v;
  }
  int32_t i32() {
    int32_t v = 0;
    raw(&v, 4);
    return v;
  }
  int64_t i64() {
    int64_t v = 0;
    raw(&v, 8);
    return v;
  }
  std::string str(size_t max_size) {
    uint32_t n = u32();
    if (!ok_ || n > max_size || size_t(end_ - p_) < n) {
      ok_ = false;
      return {};
    }
    std::string s(p_, n);
    p_ += n;
    return s;
  }

 private:
  void raw(void* v, size_t n) {
    if (!ok_ || size_t(end_ - p_) < n) {
      ok_ = false;
      return;
    }
    std::memcpy(v, p_, n);
    p_ += n;
  }
  const char* p_;
  const char* end_;
  bool ok_ = true;
};

// What a client signs to prove it holds the job's secret: the server's fresh
// nonce and the rank it claims (so a proof cannot be replayed or re-targeted).
inline std::string auth_message(const std::string& nonce, int32_t rank) {
  std::string m = "bagua-store-auth-v2:";
  m += nonce;
  m.append(reinterpret_cast<const char*>(&rank), 4);
  return m;
}

inline uint32_t frame_length(const char* header) {
  uint32_t n;
  std::memcpy(&n, header, 4);
  return n;
}

}  // namespace store_protocol
}  // namespace bagua
