// _PG_init; the SQL-callable functions are declared in entry/functions.cpp.
#include "idempotency/entry/module.hpp"
#include "idempotency/protocol/call.hpp"
#include "idempotency/settings/settings.hpp"
#include "idempotency/stats/stats.hpp"
#include "idempotency/worker/expire.hpp"
#include "idempotency/worker/status.hpp"

#include "idempotency/compat.hpp"

extern "C" {
#include "miscadmin.h"
#include "storage/ipc.h"
#include "tcop/utility.h"
#include "utils/guc.h"
}

extern "C" {
// IDEMPOTENCY_VERSION: META.json's, from the build (Makefile).
IDEMPOTENCY_MODULE_MAGIC(IDEMPOTENCY_VERSION);

void _PG_init(void);
}

namespace {

shmem_request_hook_type previous_shmem_request_hook = nullptr;
shmem_startup_hook_type previous_shmem_startup_hook = nullptr;
ProcessUtility_hook_type previous_process_utility_hook = nullptr;

// Preloading only: shared memory holds call statistics and expiry status.
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

// DISCARD ALL resets last_call_replayed() too: poolers send it between clients.
void process_utility(PlannedStmt *statement, const char *query_string,
                     bool read_only_tree, ProcessUtilityContext context,
                     ParamListInfo params, QueryEnvironment *query_env,
                     DestReceiver *dest, QueryCompletion *completion) {
  const Node *utility = statement->utilityStmt;
  bool discarding_all =
      utility != nullptr && IsA(utility, DiscardStmt) &&
      reinterpret_cast<const DiscardStmt *>(utility)->target == DISCARD_ALL;
  if (previous_process_utility_hook != nullptr)
    previous_process_utility_hook(statement, query_string, read_only_tree,
                                  context, params, query_env, dest, completion);
  else
    standard_ProcessUtility(statement, query_string, read_only_tree, context,
                            params, query_env, dest, completion);
  if (discarding_all)
    idempotency::protocol::clear_last_call();
}

} // namespace

void _PG_init(void) {
  // Before the return below: any part used in a binary upgrade still ends
  // with its transaction.
  idempotency::entry::register_transaction_callbacks();
  if (IsBinaryUpgrade)
    return;
  idempotency::settings::define();
  MarkGUCPrefixReserved("idempotency");
  // Per backend, so also when the library is loaded on first use.
  previous_process_utility_hook = ProcessUtility_hook;
  ProcessUtility_hook = process_utility;
  idempotency::entry::install_untyped_parameters_hook();
  if (!process_shared_preload_libraries_in_progress)
    return;
  previous_shmem_request_hook = shmem_request_hook;
  shmem_request_hook = request_shared_memory;
  previous_shmem_startup_hook = shmem_startup_hook;
  shmem_startup_hook = attach_shared_memory;
  idempotency::worker::register_launcher();
}
