// A key's digest as idempotency.keys stores it: the primary key holds
// (scope, key_digest) in place of the key's text (see
// fingerprint::key_digest for its size and what a shared digest costs).
#pragma once

#include "idempotency/pg.hpp"

namespace idempotency::fingerprint {

// The digest of `key`, as a bytea in the current memory context: the
// ordered digest (fingerprint::key_digests) of the key's UTF-8 form
// whatever the database encoding, so that a dump restored into a database
// of another encoding finds every key again. With `unordered`, also sets
// *unordered to the key's unordered digest where it is another (a key with
// an order), else to nullptr.
bytea *digest_of_key(const text *key, bytea **unordered = nullptr);

// The digest versions 0.4 to 0.6 store in idempotency.keys, and tenant keys
// in every version: the first 11 bytes of SHA-256 over the key's UTF-8 form
// (fingerprint::key_digest), whatever the key's shape.
bytea *unordered_digest_of_key(const text *key);

// The digest versions 0.4 and 0.5 stored: over the key's bytes in the
// database encoding, which such a database's rows hold until ALTER
// EXTENSION UPDATE recomputes them. nullptr when it is digest_of_key's
// (always, but for a key beyond ASCII in a database whose encoding is
// neither UTF8 nor SQL_ASCII).
bytea *legacy_digest_of_key(const text *key);

} // namespace idempotency::fingerprint
