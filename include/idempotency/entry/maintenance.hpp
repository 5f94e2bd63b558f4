// Bodies of the functions for DBAs and monitoring: idempotency.expire(),
// expiry_status(), stats_counters(), stats_reset(), key_digest(),
// mark_key_roles(), the DROP OWNED event trigger drop_owned_keys() and the
// GRANT and REVOKE event trigger keep_role_marks(). Each
// turns what its module answers (worker/expire, worker/status, stats,
// fingerprint/key_digest, storage/role_marks) into the SQL function's result.
#pragma once

#include "idempotency/pg.hpp"

namespace idempotency::entry {

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
