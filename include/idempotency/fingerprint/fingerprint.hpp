// Request fingerprints: a SHA-256 digest over a canonical, unambiguous
// encoding of `fn` and its arguments' types and values; and HMAC-SHA256, the
// keyed MAC behind claim lock tags. The hashing itself is done by the
// library the server hashes with (OpenSSL's EVP where the server is built
// with OpenSSL 3, else PostgreSQL's pg_cryptohash and pg_hmac; OpenSSL's FIPS
// provider is honoured): src/fingerprint/fingerprint.cpp only feeds it
// (docs/architecture.md, "Hashing").
//
// This header includes no PostgreSQL header, so server-free code and the
// unit tests include it as they are. Its types are trivially destructible
// and it never throws, so PostgreSQL code may hold one across calls that can
// ereport() (a longjmp over it skips nothing). In the server, a failure of
// the library raises an ERROR; the hashing context of a hash that an error
// interrupts is taken back when the (sub)transaction aborts.
#pragma once

#include <cstddef>
#include <cstdint>

#include "idempotency/server_free.hpp" // must be the last include

namespace idempotency::fingerprint {

// The hashing contexts a hash holds while it is open, and the kept state of
// a request's prefix (fingerprint.cpp).
struct Sha256Context;
struct HmacContext;
struct PrefixState;

// Incremental SHA-256 (FIPS 180-4). The object holds one of the backend's
// hashing contexts from its first update to finish(): one may not be copied
// meanwhile.
class Sha256 {
public:
  static constexpr std::size_t digest_size = 32;

  Sha256() noexcept = default;
  void update(const void *data, std::size_t size) noexcept;
  // Writes the digest and gives the context back; the object may start
  // again.
  void finish(std::uint8_t (&digest)[digest_size]) noexcept;

private:
  friend class RequestFingerprint;

  Sha256Context *context_ = nullptr;
};

// HMAC-SHA256 (RFC 2104): a keyed MAC that no one without the key can
// predict, invert or collide. The object keeps the key (a key longer than a
// block as its SHA-256, which RFC 2104 makes the same MAC); copying a keyed
// object that has not started a message is the cheap way to start each
// message.
class HmacSha256 {
public:
  static constexpr std::size_t mac_size = Sha256::digest_size;
  static constexpr std::size_t block_size = 64;

  HmacSha256(const void *key, std::size_t key_size) noexcept;
  void update(const void *data, std::size_t size) noexcept;
  // Writes the MAC and gives the context back; the object keeps its key.
  void finish(std::uint8_t (&mac)[mac_size]) noexcept;

private:
  std::uint8_t key_[block_size];
  std::size_t key_size_;
  HmacContext *context_ = nullptr;
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

struct OrderedKeyDigest {
  std::uint8_t bytes[max_ordered_key_digest_size];
  std::size_t size;
};
void ordered_key_digest(const char *key, std::size_t key_size,
                        OrderedKeyDigest &out) noexcept;

// The digest of a key that has no UTF-8 form (a character of the database
// encoding that Unicode lacks): SHA-256 over the byte 0xFF, which no UTF-8
// text contains, then the key's bytes in the database encoding. The marker
// keeps these digests apart from every UTF-8 key's.
void unconverted_key_digest(const char *key, std::size_t key_size,
                            std::uint8_t (&out)[key_digest_size]) noexcept;

// Builds the fingerprint of one request: fn, then every argument's type
// name, then every argument's value (or NULL), in argument order. Every
// field is framed with a tag and its length, so no two different requests
// share an encoding ("ab","c" and "a","bc" differ; a NULL differs from an
// empty value). Types come before values so that the part that depends only
// on fn and the argument types can be encoded once and copied.
//
// A request whose fingerprint the client computes is framed the same way:
// fn (or, for the application API's claim, a claim marker in its place),
// then the client's text. A stored fingerprint thus tells an idempotent_call
// of one fn from one of another fn and from a claim, whatever hash the client
// passed.
//
// fn and the types (the prefix) are kept as their encoded bytes, in memory
// palloc'd in the current memory context; the first value (or client hash,
// or NULL) hashes them and starts the hash of the rest. A copy of an object
// that has not started shares the bytes and may go on like the original.
// keep_prefix_state() hashes the prefix once and keeps the hash's state, so
// that each copy starts from it instead of hashing the prefix again (the
// statement cache's prefixes, copied for every call).
class RequestFingerprint {
public:
  RequestFingerprint(const char *fn, std::size_t fn_size) noexcept;
  // A request of the application API's claim().
  static RequestFingerprint for_claim() noexcept;
  void add_client_hash(const char *hash, std::size_t hash_size) noexcept;
  void add_type(const char *type_name, std::size_t type_name_size) noexcept;
  void add_value(const void *value, std::size_t value_size) noexcept;
  void add_null() noexcept;
  // Hashes the prefix so far and keeps the hash's state, for this object and
  // its copies, in the current memory context, which frees it when it is
  // reset or deleted: the context must outlive them, like the prefix's
  // bytes. A field added to the prefix afterwards drops the state. Without
  // OpenSSL's EVP (pg_cryptohash cannot copy a hash's state) it does nothing.
  void keep_prefix_state() noexcept;
  // Writes the digest and leaves the object in an unspecified state.
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

// In the server, called by entry/transaction.cpp (the extension's
// transaction callbacks): the hashing contexts of hashes an error
// interrupted are taken back when the transaction ends, or when the
// subtransaction they were taken in aborts (while it is the current one).
void at_transaction_end() noexcept;
void at_subtransaction_abort() noexcept;

} // namespace idempotency::fingerprint
