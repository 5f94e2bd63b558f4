// Entry points: module initialisation and the SQL-callable functions. Each
// SQL function is a thin shim over the C++ body, declared through the error
// boundary (boundary/boundary.hpp).
#include "boundary/boundary.hpp"
#include "entry/settings.hpp"
#include "protocol/app_api.hpp"
#include "protocol/call.hpp"
#include "protocol/outcome.hpp"
#include "stats/stats.hpp"
#include "worker/status.hpp"
#include "worker/worker.hpp"

extern "C" {
PG_MODULE_MAGIC;

void _PG_init(void);
}

namespace {

shmem_request_hook_type previous_shmem_request_hook = nullptr;
shmem_startup_hook_type previous_shmem_startup_hook = nullptr;

// Shared memory exists only when the library is preloaded: the call
// statistics and the expiry worker's status live there.
void request_shared_memory() {
  if (previous_shmem_request_hook != nullptr)
    previous_shmem_request_hook();
  idempotency::stats::request_shared_memory();
  idempotency::worker::status::request_shared_memory();
}

void attach_shared_memory() {
  if (previous_shmem_startup_hook != nullptr)
    previous_shmem_startup_hook();
  idempotency::stats::attach_shared_memory();
  idempotency::worker::status::attach_shared_memory();
}

} // namespace

void _PG_init(void) {
  if (IsBinaryUpgrade)
    return;
  idempotency::settings::define();
  idempotency::worker::define_settings();
  MarkGUCPrefixReserved("idempotency");
  idempotency::protocol::register_transaction_callbacks();
  if (!process_shared_preload_libraries_in_progress)
    return;
  previous_shmem_request_hook = shmem_request_hook;
  shmem_request_hook = request_shared_memory;
  previous_shmem_startup_hook = shmem_startup_hook;
  shmem_startup_hook = attach_shared_memory;
  idempotency::worker::register_launcher();
}

namespace {

Datum idempotent_call_body(FunctionCallInfo fcinfo) {
  return idempotency::protocol::idempotent_call(fcinfo);
}

Datum last_call_replayed_body(FunctionCallInfo fcinfo) {
  switch (idempotency::protocol::last_call().outcome) {
  case idempotency::protocol::Outcome::none:
    PG_RETURN_NULL();
  case idempotency::protocol::Outcome::ran:
  case idempotency::protocol::Outcome::stored_error:
    PG_RETURN_BOOL(false);
  case idempotency::protocol::Outcome::replayed:
  case idempotency::protocol::Outcome::replayed_error:
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
