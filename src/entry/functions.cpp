// Every SQL-callable function of the library, in the order the install
// scripts create them. Each is declared through the error boundary
// (boundary/boundary.hpp); its body lives in its module, declared in that
// module's header. A C symbol named in an install script and missing here
// fails CREATE EXTENSION ("could not find function").
#include "boundary/boundary.hpp"
#include "protocol/call.hpp"
#include "protocol/session.hpp"
#include "stats/stats.hpp"
#include "worker/expire.hpp"
#include "worker/status.hpp"

// clang-format off

// idempotency--0.1.sql

// idempotency.current_scope() RETURNS regrole
IDEMPOTENCY_SQL_FUNCTION(idempotency_current_scope, idempotency::protocol::current_scope_body)
// idempotency.idempotent_call(key, request_hash, fn [, VARIADIC args "any"]) RETURNS jsonb
IDEMPOTENCY_SQL_FUNCTION(idempotency_idempotent_call, idempotency::protocol::idempotent_call)
// idempotency.last_call_replayed() RETURNS boolean
IDEMPOTENCY_SQL_FUNCTION(idempotency_last_call_replayed, idempotency::protocol::last_call_replayed_body)
// idempotency.expire() RETURNS bigint
IDEMPOTENCY_SQL_FUNCTION(idempotency_expire, idempotency::worker::expire_body)
// idempotency.expiry_status() RETURNS SETOF record
IDEMPOTENCY_SQL_FUNCTION(idempotency_expiry_status, idempotency::worker::status::expiry_status_body)

// idempotency--0.1--0.2.sql

// idempotency.stats_counters() RETURNS SETOF record
IDEMPOTENCY_SQL_FUNCTION(idempotency_stats_counters, idempotency::stats::counters_body)
// idempotency.stats_reset() RETURNS void
IDEMPOTENCY_SQL_FUNCTION(idempotency_stats_reset, idempotency::stats::reset_body)

// clang-format on
