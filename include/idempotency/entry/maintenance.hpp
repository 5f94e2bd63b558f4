// Bodies of the functions for DBAs and monitoring: idempotency.expire(),
// expiry_status(), stats_counters(), stats_reset() and key_digest(). Each
// turns what its module answers (worker/expire, worker/status, stats,
// fingerprint/key_digest) into the SQL function's result.
#pragma once

#include "idempotency/pg.hpp"

namespace idempotency::entry {

Datum expire_body(FunctionCallInfo fcinfo);
Datum expiry_status_body(FunctionCallInfo fcinfo);
Datum stats_counters_body(FunctionCallInfo fcinfo);
Datum stats_reset_body(FunctionCallInfo fcinfo);
Datum key_digest_body(FunctionCallInfo fcinfo);

} // namespace idempotency::entry
