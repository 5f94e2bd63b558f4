// A key's digest as idempotency.keys stores it: the primary key holds
// (scope, key_digest) in place of the key's text (see
// fingerprint::key_digest for its size and what a shared digest costs).
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

// The UTF-8 form of `size` bytes of text in the database encoding: the
// bytes themselves where they already are (a UTF8 or SQL_ASCII database, or
// ASCII text), else a palloc'd conversion, `*owned` set and `*utf8_size`
// its length; nullptr when the text has no UTF-8 form (a character of the
// database encoding that Unicode lacks).
const char *utf8_form(const char *bytes, Size size, bool *owned,
                      Size *utf8_size);

// The length in bytes of the UTF-8 form of `size` bytes of text in the
// database encoding (utf8_form), or `size` when the text has none: what a
// key's limit counts, the same in every database the key can move to.
Size utf8_length(const char *bytes, Size size);

} // namespace idempotency::fingerprint
