// SHA-256 and HMAC-SHA256 (FIPS 180-4, RFC 2104), self-contained: the store
// authenticates its clients with them and the engine links no crypto library.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <string>

namespace bagua {

using Digest = std::array<uint8_t, 32>;

Digest sha256(const void* data, size_t size);
Digest hmac_sha256(const std::string& key, const void* data, size_t size);
// Compares in time independent of where the digests differ.
bool digests_equal(const Digest& a, const Digest& b);

}  // namespace bagua
