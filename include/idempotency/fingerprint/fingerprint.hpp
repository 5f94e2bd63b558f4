// Request fingerprints: a SHA-256 digest over a canonical, unambiguous
// encoding of `fn` and its arguments' types and values; and HMAC-SHA256, the
// keyed MAC behind claim lock tags.
//
// This unit includes no PostgreSQL header. Its types are trivially
// destructible and it never throws, so PostgreSQL code may hold one across
// calls that can ereport() (a longjmp over it skips nothing).
#pragma once

#include <cstddef>
#include <cstdint>

#include "idempotency/server_free.hpp" // must be the last include

namespace idempotency::fingerprint {

// Incremental SHA-256 (FIPS 180-4).
class Sha256 {
public:
  static constexpr std::size_t digest_size = 32;

  Sha256() noexcept;
  void update(const void *data, std::size_t size) noexcept;
  // Writes the digest and leaves the object in an unspecified state.
  void finish(std::uint8_t (&digest)[digest_size]) noexcept;

private:
  void compress(const std::uint8_t *block) noexcept;

  std::uint32_t state_[8];
  std::uint64_t total_bytes_;
  std::uint8_t buffer_[64];
  std::size_t buffered_;
};

// HMAC-SHA256 (RFC 2104): a keyed MAC that no one without the key can
// predict, invert or collide. The key is absorbed once, at construction;
// copying a keyed object is the cheap way to start each message.
class HmacSha256 {
public:
  static constexpr std::size_t mac_size = Sha256::digest_size;

  HmacSha256(const void *key, std::size_t key_size) noexcept;
  void update(const void *data, std::size_t size) noexcept;
  // Writes the MAC and leaves the object in an unspecified state.
  void finish(std::uint8_t (&mac)[mac_size]) noexcept;

private:
  Sha256 inner_;
  Sha256 outer_;
};

// A stored request fingerprint: a raw SHA-256 digest.
constexpr std::size_t fingerprint_size = Sha256::digest_size;
using Fingerprint = std::uint8_t[fingerprint_size];

// A key's digest, the part of the key the primary key holds: the first
// key_digest_size bytes of SHA-256 over the key's UTF-8 bytes (the server
// converts the key to UTF-8 first, see fingerprint/key_digest.hpp, so that
// the digest is the same in a database of any encoding). Eleven bytes keep a
// B-tree entry of (role, digest) at 24 bytes, the smallest a two-column
// entry takes; within one role, two live keys share a digest with
// probability n^2 / 2^89 (4e-12 for 50 million keys), and the key's text,
// compared on every lookup, turns a shared digest into an error, never into
// another key's response.
constexpr std::size_t key_digest_size = 11;
void key_digest(const char *key, std::size_t key_size,
                std::uint8_t (&out)[key_digest_size]) noexcept;

// A key's ordered digest follows the key's own order when the key has one,
// so that the keys of a time-ordered or sequential series lie next to each
// other in the primary key and a new one lands at the series' edge, on a
// page already written since the last checkpoint, instead of on a page of
// its own anywhere in the index:
//   - UUIDv7 text (8-4-4-4-12 hex digits, version 7, RFC 9562 variant): its
//     48-bit millisecond timestamp, then the first 8 bytes of SHA-256 over
//     the key: 14 bytes;
//   - a key that ends in 6 to 18 ASCII digits after a prefix that is empty
//     or holds a character other than hex digits and '-' (a sequential
//     business id such as "order-000000123", not the end of a random UUID):
//     the first 8 bytes of SHA-256 over the prefix and the number of digits,
//     then the number, big-endian: 16 bytes, in numeric order among the keys
//     of one prefix and length;
//   - any other key: key_digest, 11 bytes.
// The three lengths differ, so digests of different kinds never meet.
// Within one kind, two keys share a digest with probability 2^-64 or less
// per pair (and only within one millisecond, or one prefix), which the
// key's text, compared on every lookup, turns into an error.
constexpr std::size_t max_ordered_key_digest_size = 16;

struct KeyDigests {
  std::uint8_t ordered[max_ordered_key_digest_size];
  std::size_t ordered_size;
  // key_digest, which versions before 0.7 store for every key.
  std::uint8_t unordered[key_digest_size];

  bool differ() const noexcept { return ordered_size != key_digest_size; }
};
void key_digests(const char *key, std::size_t key_size,
                 KeyDigests &out) noexcept;

// The digest of a key that has no UTF-8 form (a character of the database
// encoding that Unicode lacks): SHA-256 over the byte 0xFF, which no UTF-8
// text contains, then the key's bytes in the database encoding. The marker
// keeps these digests apart from every UTF-8 key's.
void unconverted_key_digest(const char *key, std::size_t key_size,
                            std::uint8_t (&out)[key_digest_size]) noexcept;

// The fingerprint that rows stored before version 0.3 hold for a client's
// request_hash text. Those rows kept the text itself; the upgrade to 0.4
// stored a text that spells a lower-case hex SHA-256 as the 32 bytes it
// spells, and any other text as its SHA-256.
void legacy_fingerprint(const char *client_hash, std::size_t size,
                        Fingerprint &out) noexcept;

// Builds the fingerprint of one request: fn, then every argument's type
// name, then every argument's value (or NULL), in argument order. Every
// field is framed with a tag and its length, so no two different requests
// share an encoding ("ab","c" and "a","bc" differ; a NULL differs from an
// empty value). Types come before values so that the part that depends only
// on fn and the argument types can be computed once and copied.
//
// A request whose fingerprint the client computes is framed the same way:
// fn (or, for the application API's claim, a claim marker in its place),
// then the client's text. A stored fingerprint thus tells an idempotent_call
// of one fn from one of another fn and from a claim, whatever hash the client
// passed.
class RequestFingerprint {
public:
  RequestFingerprint(const char *fn, std::size_t fn_size) noexcept;
  // A request of the application API's claim().
  static RequestFingerprint for_claim() noexcept;
  void add_client_hash(const char *hash, std::size_t hash_size) noexcept;
  void add_type(const char *type_name, std::size_t type_name_size) noexcept;
  void add_value(const void *value, std::size_t value_size) noexcept;
  void add_null() noexcept;
  // Writes the digest and leaves the object in an unspecified state.
  void finish(Fingerprint &out) noexcept;

private:
  RequestFingerprint() noexcept = default;
  void add_field(std::uint8_t tag, const void *data, std::size_t size) noexcept;

  Sha256 hash_;
};

} // namespace idempotency::fingerprint
