// Request fingerprints (SHA-256 over a framed encoding of fn and its
// arguments) and HMAC-SHA256, hashed by the library the server hashes with
// (docs/architecture.md, "Hashing").
//
// Includes no PostgreSQL header, so server-free code and the unit tests use
// it. Its types are trivially destructible and never throw, so PostgreSQL
// code may hold one across calls that can ereport(). In the server a failure
// of the library raises an ERROR; the context of a hash an error interrupts
// is taken back when the (sub)transaction aborts.
#pragma once

#include <cstddef>
#include <cstdint>

#include "idempotency/server_free.hpp" // must be the last include

namespace idempotency::fingerprint {

struct Sha256Context;
struct HmacContext;
struct PrefixState;

// Incremental SHA-256. The object holds one of the backend's hashing
// contexts from its first update to finish(): it may not be copied
// meanwhile.
class Sha256 {
public:
  static constexpr std::size_t digest_size = 32;

  Sha256() noexcept = default;
  void update(const void *data, std::size_t size) noexcept;
  // Gives the context back; the object may start again.
  void finish(std::uint8_t (&digest)[digest_size]) noexcept;

private:
  friend class RequestFingerprint;

  Sha256Context *context_ = nullptr;
};

// HMAC-SHA256 (RFC 2104). The object keeps the key (one longer than a block
// as its SHA-256, the same MAC); copying a keyed object that has not started
// is the cheap way to start each message.
class HmacSha256 {
public:
  static constexpr std::size_t mac_size = Sha256::digest_size;
  static constexpr std::size_t block_size = 64;

  HmacSha256(const void *key, std::size_t key_size) noexcept;
  void update(const void *data, std::size_t size) noexcept;
  // Gives the context back; the object keeps its key.
  void finish(std::uint8_t (&mac)[mac_size]) noexcept;

private:
  std::uint8_t key_[block_size];
  std::size_t key_size_;
  HmacContext *context_ = nullptr;
};

constexpr std::size_t fingerprint_size = Sha256::digest_size;
using Fingerprint = std::uint8_t[fingerprint_size];

// The first 11 bytes of SHA-256 over the key's UTF-8 bytes. Eleven bytes keep
// a B-tree entry of (role, digest) at 24 bytes, the smallest a two-column
// entry takes; two live keys of a role share a digest with probability
// n^2 / 2^89 (4e-12 for 50 million keys), and the key's text, compared on
// every lookup, turns that into an error, never into another key's response.
constexpr std::size_t key_digest_size = 11;
void key_digest(const char *key, std::size_t key_size,
                std::uint8_t (&out)[key_digest_size]) noexcept;

// A digest that follows the key's own order when it has one, so that a new
// key of a time-ordered or sequential series lands on a page of the primary
// key already written since the last checkpoint:
//   - UUIDv7 text: its 48-bit millisecond timestamp, then the first 8 bytes
//     of SHA-256 over the key (14 bytes);
//   - 6 to 18 trailing ASCII digits after a prefix that is empty or holds a
//     character other than hex digits and '-' (not the end of a random
//     UUID): the first 8 bytes of SHA-256 over the prefix and the number of
//     digits, then the number, big-endian (16 bytes);
//   - any other key: key_digest (11 bytes).
// The lengths differ, so kinds never meet; within one, a pair shares a
// digest with probability 2^-64 or less.
constexpr std::size_t max_ordered_key_digest_size = 16;

struct OrderedKeyDigest {
  std::uint8_t bytes[max_ordered_key_digest_size];
  std::size_t size;
};
void ordered_key_digest(const char *key, std::size_t key_size,
                        OrderedKeyDigest &out) noexcept;

// A key with no UTF-8 form: SHA-256 over the byte 0xFF, which no UTF-8 text
// contains, then the key's bytes in the database encoding.
void unconverted_key_digest(const char *key, std::size_t key_size,
                            std::uint8_t (&out)[key_digest_size]) noexcept;

// One request's fingerprint: fn (or, for the application API's claim, a
// claim marker), then every argument's type name, then every value (or
// NULL), or else the client's hash. Every field is framed with a tag and its
// length, so no two different requests share an encoding. Types come before
// values so that the prefix (fn and types) is encoded once, palloc'd in the
// current memory context, and shared by copies; the first value hashes it.
// keep_prefix_state() hashes the prefix once, so that each copy starts from
// that state (the statement cache's prefixes, copied for every call).
class RequestFingerprint {
public:
  RequestFingerprint(const char *fn, std::size_t fn_size) noexcept;
  static RequestFingerprint for_claim() noexcept;
  void add_client_hash(const char *hash, std::size_t hash_size) noexcept;
  void add_type(const char *type_name, std::size_t type_name_size) noexcept;
  void add_value(const void *value, std::size_t value_size) noexcept;
  void add_null() noexcept;
  // The state lives in the current memory context, which must outlive this
  // object and its copies; a field added to the prefix afterwards drops it.
  // Does nothing without EVP (pg_cryptohash cannot copy a hash's state).
  void keep_prefix_state() noexcept;
  // Leaves the object in an unspecified state.
  void finish(Fingerprint &out) noexcept;

private:
  struct Prefix; // the encoded bytes, shared by copies

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

// Called by the extension's transaction callbacks: the contexts of hashes an
// error interrupted are taken back at the transaction's end, or when the
// (current) subtransaction they were taken in aborts.
void at_transaction_end() noexcept;
void at_subtransaction_abort() noexcept;

} // namespace idempotency::fingerprint
