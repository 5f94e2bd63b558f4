// A key's digest as idempotency.keys stores it: the primary key holds
// (scope, key_digest) in place of the key's text (see
// fingerprint::key_digest for its size and what a shared digest costs).
#pragma once

#include "pg.hpp"

namespace idempotency::fingerprint {

// The digest of `key`'s bytes, as a bytea in the current memory context.
bytea *digest_of_key(const text *key);

// idempotency.key_digest(key text) RETURNS bytea, so that a DBA can find a
// key through the primary key.
Datum key_digest_body(FunctionCallInfo fcinfo);

} // namespace idempotency::fingerprint
