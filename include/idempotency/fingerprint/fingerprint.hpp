// SHA-256, HMAC-SHA256, key digests, fingerprints (docs/architecture.md,
// "Hashing"). Server-free, for the unit tests; its types are trivially
// destructible and never throw: server code may hold one across ereport().
#pragma once

#include <cstddef>
#include <cstdint>

#include "idempotency/server_free.hpp" // must be the last include

namespace idempotency::fingerprint {

struct Sha256Context;
struct HmacContext;
struct PrefixState;

// Not to be copied from its first update to finish(): it holds a hash context.
class Sha256 {
public:
  static constexpr std::size_t digest_size = 32;

  void update(const void *data, std::size_t size) noexcept;
  void finish(std::uint8_t (&digest)[digest_size]) noexcept;

private:
  friend class RequestFingerprint;

  Sha256Context *context_ = nullptr;
};

// Copying a keyed object not yet started is the cheap start of a message.
class HmacSha256 {
public:
  static constexpr std::size_t mac_size = Sha256::digest_size;
  static constexpr std::size_t block_size = 64;

  HmacSha256(const void *key, std::size_t key_size) noexcept;
  void update(const void *data, std::size_t size) noexcept;
  void finish(std::uint8_t (&mac)[mac_size]) noexcept;

private:
  std::uint8_t key_[block_size];
  std::size_t key_size_;
  HmacContext *context_ = nullptr;
};

constexpr std::size_t fingerprint_size = Sha256::digest_size;
using Fingerprint = std::uint8_t[fingerprint_size];

// The first 11 bytes of SHA-256 over the key's UTF-8 bytes: a B-tree entry
// of (role, digest) takes 24 bytes, the smallest a two-column entry takes.
// The key's text, compared on every lookup, turns a shared digest (n^2 /
// 2^89) into an error, never into another key's response.
constexpr std::size_t key_digest_size = 11;
void key_digest(const char *key, std::size_t key_size,
                std::uint8_t (&out)[key_digest_size]) noexcept;

// Follows a time-ordered or sequential key's own order, so a new key lands
// on a primary key page written since the last checkpoint: UUIDv7 text as
// its timestamp and 8 bytes of SHA-256 (14 bytes); a key ending in 6 to 18
// digits as 8 bytes of SHA-256 over the rest and the digit count, then the
// number (16 bytes); any other as key_digest; the lengths keep kinds apart.
constexpr std::size_t max_ordered_key_digest_size = 16;

struct OrderedKeyDigest {
  std::uint8_t bytes[max_ordered_key_digest_size];
  std::size_t size;
};
void ordered_key_digest(const char *key, std::size_t key_size,
                        OrderedKeyDigest &out) noexcept;

// A key with no UTF-8 form: 0xFF, never in UTF-8, then its bytes as stored.
void unconverted_key_digest(const char *key, std::size_t key_size,
                            std::uint8_t (&out)[key_digest_size]) noexcept;

// fn (or the claim marker), each argument's type name, then each value or
// NULL (or the client's hash), each framed with a tag and its length: no two
// requests share an encoding. Copies share the prefix (fn, types), palloc'd.
class RequestFingerprint {
public:
  RequestFingerprint(const char *fn, std::size_t fn_size) noexcept {
    add_field(tag_function, fn, fn_size);
  }
  static RequestFingerprint for_claim() noexcept {
    RequestFingerprint fingerprint;
    fingerprint.add_field(tag_claim_api, nullptr, 0);
    return fingerprint;
  }
  void add_client_hash(const char *hash, std::size_t hash_size) noexcept {
    add_field(tag_client_hash, hash, hash_size);
  }
  void add_type(const char *type_name, std::size_t type_name_size) noexcept {
    add_field(tag_type_name, type_name, type_name_size);
  }
  void add_value(const void *value, std::size_t value_size) noexcept {
    add_field(tag_value, value, value_size);
  }
  void add_null() noexcept { add_field(tag_null_value, nullptr, 0); }
  // Hashes the prefix once for all copies, in the current memory context,
  // which must outlive them. Does nothing without EVP (pg_cryptohash cannot
  // copy a hash's state).
  void keep_prefix_state() noexcept;
  void finish(Fingerprint &out) noexcept;

private:
  struct Prefix; // the encoded bytes, shared by copies

  // Distinct tags: a NULL, a value, a type name and fn never encode alike.
  static constexpr std::uint8_t tag_function = 0x01;
  static constexpr std::uint8_t tag_null_value = 0x03;
  static constexpr std::uint8_t tag_type_name = 0x04;
  static constexpr std::uint8_t tag_value = 0x05;
  static constexpr std::uint8_t tag_client_hash = 0x06;
  static constexpr std::uint8_t tag_claim_api = 0x07;

  RequestFingerprint() noexcept = default;
  void add_field(std::uint8_t tag, const void *data, std::size_t size) noexcept;
  void append_to_prefix(const void *data, std::size_t size) noexcept;
  void start() noexcept;

  Prefix *prefix_ = nullptr;
  std::size_t prefix_size_ = 0;         // this object's part of *prefix_
  PrefixState *prefix_state_ = nullptr; // of all prefix_size_ bytes
  bool started_ = false;                // the prefix is hashed, values follow
  Sha256 hash_;
};

// Take back the contexts of hashes an error interrupted.
void at_transaction_end() noexcept;
void at_subtransaction_abort() noexcept;

} // namespace idempotency::fingerprint
