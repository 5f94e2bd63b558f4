// Rows that reach idempotency.keys without idempotent_call: a restored
// dump's COPY, or a superuser's INSERT. pg_restore creates the current
// version, then copies the dumped version's columns.
//
// - key_digest is computed from the key, whatever the row holds: a dump of
//   another version or of a database of another encoding may hold other
//   digests (those of 0.4 to 0.6, for one).
// - request_hash must be a fingerprint (32 bytes) and status NULL: rows of
//   dumps made before 0.4 are refused (0A000), with a hint to restore them
//   into 0.7 first.
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
// idempotency.keys (fingerprint::digest_of_key).
Datum keys_loaded_body(FunctionCallInfo fcinfo);

} // namespace idempotency::protocol
