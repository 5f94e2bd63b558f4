// A key's digest as idempotency.keys stores it, and the keys derived from a
// key for the calls a request's handler makes downstream.
#pragma once

#include "idempotency/pg.hpp"

namespace idempotency::fingerprint {

// The ordered digest for the primary key, of the key's UTF-8 form whatever
// the database encoding: a dump restored into another encoding finds it.
bytea *digest_of_key(const text *key);

// key_digest for tenant_keys, whose Citus shards keep their written digests.
bytea *tenant_digest_of_key(const text *key);

// What a key's limit counts, the same in every database the key can move to.
Size utf8_length(const char *bytes, Size size);

bytea *as_bytea(const void *bytes, Size size);

// The key of a downstream call (docs/downstream.md): HMAC-SHA256 over the
// role, the key and the label, each framed, shown as a version 8 UUID, which
// every provider's limits accept (AWS's 64, Square's 45). Without the
// secret no one can tell it from a random UUID or compute another role's.
text *derived_key(const uint8 *secret, std::size_t secret_size, Oid role,
                  const text *key, const text *label);

} // namespace idempotency::fingerprint
