// Entry points: module initialisation and the SQL-callable functions. Each
// SQL function is a thin shim over the C++ body, declared through the error
// boundary (boundary/boundary.hpp).
#include "boundary/boundary.hpp"
#include "entry/settings.hpp"
#include "protocol/call.hpp"
#include "worker/worker.hpp"

extern "C" {
PG_MODULE_MAGIC;

void _PG_init(void);
}

void _PG_init(void) {
  if (IsBinaryUpgrade)
    return;
  idempotency::settings::define();
  idempotency::worker::define_settings();
  MarkGUCPrefixReserved("idempotency");
  if (process_shared_preload_libraries_in_progress)
    idempotency::worker::register_launcher();
}

namespace {

Datum idempotent_call_body(FunctionCallInfo fcinfo) {
  return idempotency::protocol::idempotent_call(fcinfo);
}

Datum last_call_replayed_body(FunctionCallInfo fcinfo) {
  switch (idempotency::protocol::last_call()) {
  case idempotency::protocol::LastCall::none:
    PG_RETURN_NULL();
  case idempotency::protocol::LastCall::ran:
    PG_RETURN_BOOL(false);
  case idempotency::protocol::LastCall::replayed:
    PG_RETURN_BOOL(true);
  }
  pg_unreachable();
}

Datum current_scope_body(FunctionCallInfo) {
  return ObjectIdGetDatum(GetUserId());
}

} // namespace

IDEMPOTENCY_SQL_FUNCTION(idempotency_idempotent_call, idempotent_call_body)
IDEMPOTENCY_SQL_FUNCTION(idempotency_last_call_replayed,
                         last_call_replayed_body)
IDEMPOTENCY_SQL_FUNCTION(idempotency_current_scope, current_scope_body)
