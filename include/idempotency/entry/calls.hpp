// Bodies of idempotency.idempotent_call and idempotency.tenant_call: their
// SQL arguments read and checked, the call made (protocol/call), the
// response returned; and of what a caller asks around its calls.
#pragma once

#include "idempotency/pg.hpp"

namespace idempotency::entry {

Datum idempotent_call_body(FunctionCallInfo fcinfo);

// The same with the tenant first, its key in idempotency.tenant_keys
// (storage/tenant_keys.hpp).
Datum tenant_call_body(FunctionCallInfo fcinfo);

// --- what SQL may ask about the calling session ------------------------------

// Body of idempotency.current_scope(): the role keys are scoped to, the
// current user (idempotency.keys' row-level security policy uses it).
Datum current_scope_body(FunctionCallInfo fcinfo);

// Body of idempotency.last_call_replayed(): true when the session's last
// completed call replayed a stored response, false when it ran fn, NULL
// before any call or after a call that raised an error.
Datum last_call_replayed_body(FunctionCallInfo fcinfo);

// --- keys for calls outside the database -------------------------------------
//
// The keys of the calls a request's handler makes downstream
// (docs/downstream.md).

// Body of idempotency.derived_key(key, label): the key derived for the
// current role from `key` and `label` with the database's derived-key
// secret (fingerprint/key_digest.hpp). Key and label are checked like a
// call's key: 22004 when NULL, 22023 when empty or over 255 bytes.
Datum derived_key_body(FunctionCallInfo fcinfo);

} // namespace idempotency::entry
