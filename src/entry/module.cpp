// Module initialisation: settings, shared memory and the expiry launcher.
// The SQL-callable functions are declared in entry/functions.cpp.
#include "settings/settings.hpp"
#include "stats/stats.hpp"
#include "worker/launcher.hpp"
#include "worker/status.hpp"

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
  MarkGUCPrefixReserved("idempotency");
  if (!process_shared_preload_libraries_in_progress)
    return;
  previous_shmem_request_hook = shmem_request_hook;
  shmem_request_hook = request_shared_memory;
  previous_shmem_startup_hook = shmem_startup_hook;
  shmem_startup_hook = attach_shared_memory;
  idempotency::worker::register_launcher();
}
