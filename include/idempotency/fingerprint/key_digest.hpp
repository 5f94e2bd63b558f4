// A key's digest as idempotency.keys stores it, and the keys derived from a
// key for the calls a request's handler makes downstream.
#pragma once

#include "idempotency/pg.hpp"

namespace idempotency::fingerprint {

// The primary key's digest of `key`, as a bytea: the ordered digest of the
// key's UTF-8 form whatever the database encoding, so that a dump restored
// into a database of another encoding finds every key again.
bytea *digest_of_key(const text *key);

// The digest idempotency.tenant_keys holds: key_digest of the UTF-8 form,
// whatever the key's shape. Its rows live in Citus shards, which keep the
// digest they were written with.
bytea *tenant_digest_of_key(const text *key);

// The length in bytes of the text's UTF-8 form, or `size` when it has none:
// what a key's limit counts, the same in every database the key can move to.
Size utf8_length(const char *bytes, Size size);

bytea *as_bytea(const void *bytes, Size size);

// The key of a downstream call, the same for every retry of the request
// (docs/downstream.md): HMAC-SHA256 keyed with the database's derived-key
// secret over "idempotency derived-key v1", the role's OID (4 bytes,
// big-endian), then the key and the label, each framed by a tag (UTF-8 or
// database encoding) and a length (8 bytes, little-endian), so that no two
// (role, key, label) share a message. Text is taken in UTF-8 where it has
// that form, so a restore into another encoding derives the same keys.
//
// Its text is the MAC's first 16 bytes as a UUID of version 8 (RFC 9562's
// custom layout): 36 characters of [0-9a-f-] that every provider's limits
// and syntax accept (Stripe's 255, AWS's 64, Square's 45). Without the
// secret, no one can tell one from a random UUID or compute another role's.
constexpr std::size_t derived_key_size = 36;

text *derived_key(const uint8 *secret, std::size_t secret_size, Oid role,
                  const text *key, const text *label);

} // namespace idempotency::fingerprint
