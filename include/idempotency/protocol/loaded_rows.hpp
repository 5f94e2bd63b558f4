// Rows that reach idempotency.keys without idempotent_call: a restored
// dump's COPY, a superuser's INSERT, or logical replication's apply (the
// trigger is enabled ALWAYS), from another version or encoding. The store
// leaves this trigger out of its result relation, so a call never runs it.
#pragma once

#include "idempotency/pg.hpp"

namespace idempotency::protocol {

// idempotency.keys_loaded() RETURNS trigger: BEFORE INSERT FOR EACH ROW on
// idempotency.keys. Computes key_digest from the key, whatever the row
// holds, and refuses (0A000) rows of dumps made before 0.4.
Datum keys_loaded_body(FunctionCallInfo fcinfo);

} // namespace idempotency::protocol
