// The bodies of the SQL-callable functions, by the file of entry/ that
// holds them; src/entry/functions.cpp declares each through the error
// boundary. A body reads its SQL arguments, calls the layer below with plain
// values and turns the answer into the SQL function's result.
#pragma once

#include "idempotency/pg.hpp"

namespace idempotency::entry {

// --- calls.cpp: idempotent_call, tenant_call ---------------------------------
//
// idempotency.idempotent_call and tenant_call: their SQL arguments read and
// checked, the call made (protocol/call), the response returned.

Datum idempotent_call_body(FunctionCallInfo fcinfo);

// The same with the tenant first, its key in idempotency.tenant_keys
// (storage/tenant_keys.hpp).
Datum tenant_call_body(FunctionCallInfo fcinfo);

// --- calls.cpp: what SQL may ask about the calling session -------------------

// Body of idempotency.current_scope(): the role keys are scoped to, the
// current user (idempotency.keys' row-level security policy uses it).
Datum current_scope_body(FunctionCallInfo fcinfo);

// Body of idempotency.last_call_replayed(): true when the session's last
// completed call replayed a stored response, false when it ran fn, NULL
// before any call or after a call that raised an error.
Datum last_call_replayed_body(FunctionCallInfo fcinfo);

// --- calls.cpp: keys for calls outside the database --------------------------
//
// The keys of the calls a request's handler makes downstream
// (docs/downstream.md).

// Body of idempotency.derived_key(key, label): the key derived for the
// current role from `key` and `label` with the database's derived-key
// secret (fingerprint/key_digest.hpp). Key and label are checked like a
// call's key: 22004 when NULL, 22023 when empty or over 255 bytes.
Datum derived_key_body(FunctionCallInfo fcinfo);

// --- app_results.cpp: the application API ------------------------------------
//
// idempotency.claim, complete, release, last_call, lookup and forget, and their
// tenant_* variants: each turns what the protocol answers into the SQL
// function's result.

Datum claim_body(FunctionCallInfo fcinfo);
Datum complete_body(FunctionCallInfo fcinfo);
Datum release_body(FunctionCallInfo fcinfo);
Datum last_call_body(FunctionCallInfo fcinfo);
Datum lookup_body(FunctionCallInfo fcinfo);
Datum forget_body(FunctionCallInfo fcinfo);
// idempotency.claim_batch(keys, request_hashes), complete_batch(keys,
// responses): the same for many keys in one statement.
Datum claim_batch_body(FunctionCallInfo fcinfo);
Datum complete_batch_body(FunctionCallInfo fcinfo);

// The same for tenant keys: idempotency.tenant_claim ... tenant_forget, the
// tenant first.
Datum tenant_claim_body(FunctionCallInfo fcinfo);
Datum tenant_complete_body(FunctionCallInfo fcinfo);
Datum tenant_release_body(FunctionCallInfo fcinfo);
Datum tenant_lookup_body(FunctionCallInfo fcinfo);
Datum tenant_forget_body(FunctionCallInfo fcinfo);

// --- maintenance.cpp: for DBAs and monitoring --------------------------------
//
// idempotency.expire(), expiry_status(), stats_counters(), stats_reset(),
// key_digest(), mark_key_roles(), the DROP OWNED event trigger
// drop_owned_keys() and the GRANT and REVOKE event trigger keep_role_marks().
// Each turns what its module answers (worker/expire, worker/status, stats,
// fingerprint/key_digest, storage/role_marks) into the SQL function's result.

Datum expire_body(FunctionCallInfo fcinfo);
Datum expiry_status_body(FunctionCallInfo fcinfo);
Datum stats_counters_body(FunctionCallInfo fcinfo);
Datum stats_reset_body(FunctionCallInfo fcinfo);
Datum key_digest_body(FunctionCallInfo fcinfo);
[[noreturn]] Datum schema_before_0_7_body(FunctionCallInfo fcinfo);
Datum mark_key_roles_body(FunctionCallInfo fcinfo);
Datum drop_owned_keys_body(FunctionCallInfo fcinfo);
Datum keep_role_marks_body(FunctionCallInfo fcinfo);

} // namespace idempotency::entry
