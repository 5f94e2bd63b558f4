// A key's digest as idempotency.keys stores it: the primary key holds
// (scope, key_digest) in place of the key's text (see
// fingerprint::key_digest for its size and what a shared digest costs). And
// the keys derived from a key, a keyed digest of it, for the calls a
// request's handler makes downstream.
#pragma once

#include "idempotency/pg.hpp"

namespace idempotency::fingerprint {

// The digest of `key`, as a bytea in the current memory context: the
// ordered digest (fingerprint::ordered_key_digest) of the key's UTF-8 form
// whatever the database encoding, so that a dump restored into a database
// of another encoding finds every key again.
bytea *digest_of_key(const text *key);

// The digest idempotency.tenant_keys holds: the first 11 bytes of SHA-256
// over the key's UTF-8 form (fingerprint::key_digest), whatever the key's
// shape. Its rows live in Citus shards, which keep the digest they were
// written with.
bytea *tenant_digest_of_key(const text *key);

// The length in bytes of the UTF-8 form of `size` bytes of text in the
// database encoding, or `size` when the text has none: what a key's limit
// counts, the same in every database the key can move to.
Size utf8_length(const char *bytes, Size size);

// `size` bytes as a bytea, in the current memory context.
bytea *as_bytea(const void *bytes, Size size);

// --- derived keys ------------------------------------------------------------
//
// The key of a call a request's handler makes downstream (a payment provider's
// Idempotency-Key, an email's message id, an outbox row's key), derived from
// the request's own key so that every retry of the request derives the same one
// (docs/downstream.md).
//
// The derived key is HMAC-SHA256 keyed with the database's derived-key
// secret (storage/secrets.hpp) over
//   "idempotency derived-key v1", then the role's OID (4 bytes,
//   big-endian), then the key, then the label, the key and the label each
//   as a tag (UTF-8 or database encoding) and a length (8 bytes,
//   little-endian) before its bytes,
// so that no two (role, key, label) share a message, whatever their bytes
// ("ab","c" and "a","bc" differ). Key and label are taken in UTF-8 whatever
// the database encoding, so a restore into a database of another encoding
// derives the same keys; text that has no UTF-8 form is taken as it is, under
// another tag.
//
// Its text is the MAC's first 16 bytes as a UUID of version 8 (RFC 9562's
// version for custom layouts): 36 characters of [0-9a-f-], 122 bits of the
// MAC, that providers that want a UUID accept, as every HTTP header, URL and
// e-mail address does, and that fits their limits (Stripe's 255, AWS's 64,
// Square's 45). Without the secret, no one can tell one from a random UUID
// or compute another role's.

constexpr std::size_t derived_key_size = 36;

// The derived key's text, in the current memory context. The secret is 32
// bytes.
text *derived_key(const uint8 *secret, std::size_t secret_size, Oid role,
                  const text *key, const text *label);

} // namespace idempotency::fingerprint
