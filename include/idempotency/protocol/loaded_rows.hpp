// Rows that reach idempotency.keys without idempotent_call: a restored
// dump's COPY, or a superuser's INSERT. Every version's dump loads into the
// current table: pg_restore creates the current version, then copies the
// dumped version's columns.
//
// - key_digest is computed from the key, whatever the row holds: dumps of
//   0.4 and 0.5 from a database of another encoding than UTF8 hold digests
//   over that encoding (fingerprint::legacy_digest_of_key).
// - A row without key_digest is in the layout of versions before 0.4:
//   request_hash arrived as the text those versions stored, read as bytea,
//   and becomes the fingerprint the update to 0.4 makes of that text
//   (fingerprint::legacy_fingerprint).
// - status, the column of 0.1 and 0.2 that the table keeps so that their
//   dumps load, is left NULL.
//
// idempotent_call writes its rows itself, key_digest included; the store
// leaves this trigger out of its result relation (storage::store), so a
// call never runs it. It is enabled ALWAYS: logical replication's apply
// runs it too, for rows published by a node of another encoding or an
// older version.
#pragma once

#include "idempotency/pg.hpp"

namespace idempotency::protocol {

// idempotency.keys_loaded() RETURNS trigger: BEFORE INSERT FOR EACH ROW on
// idempotency.keys. key_digest is the ordered digest since 0.7
// (fingerprint::digest_of_key); unordered_keys_loaded_body is the function
// of versions 0.4 to 0.6, whose tables hold unordered digests.
Datum keys_loaded_body(FunctionCallInfo fcinfo);
Datum unordered_keys_loaded_body(FunctionCallInfo fcinfo);

} // namespace idempotency::protocol
