// The expiry launcher: a background worker connected to no database. Each
// round it lists the databases from the shared catalog pg_database and, one
// at a time, starts a short-lived worker in each (database_round.cpp) and
// waits for it to end, then sleeps idempotency.expire_interval.
//
// Connecting to no database itself, the launcher never stands in the way of
// DROP DATABASE; the per-database workers connect only for a round and leave
// early when such a command waits for their database.
#include "idempotency/worker/launcher.hpp"

#include "idempotency/settings/settings.hpp"
#include "idempotency/worker/status.hpp"

#include "idempotency/compat.hpp"

extern "C" {
#include "access/heapam.h"
#include "catalog/pg_database.h"
#include "postmaster/interrupt.h"
#include "storage/ipc.h"
#include "storage/latch.h"
#include "storage/lock.h"
#include "tcop/tcopprot.h"
#include "utils/backend_status.h"
#include "utils/memutils.h"
#include "utils/snapmgr.h"
#include "utils/wait_event.h"
}

extern "C" {
PGDLLEXPORT void idempotency_launcher_main(Datum main_arg);
}

namespace idempotency::worker {

namespace {

constexpr const char *launcher_type = "idempotency launcher";
// After pg_terminate_backend, or a crash of the server, the postmaster
// starts the launcher again after this many seconds.
constexpr int launcher_restart_seconds = 5;

struct DatabaseList {
  Oid *oids;
  int count;
};
static_assert(std::is_trivially_destructible_v<DatabaseList>);

// Databases a round serves: those that accept connections. Templates are
// left alone (they are copied rather than used, and a connection to one
// would hold up CREATE DATABASE), and so are databases a DROP DATABASE left
// half-dropped. Allocated in the caller's memory context.
DatabaseList list_databases() {
  MemoryContext caller_context = CurrentMemoryContext;
  SetCurrentStatementStartTimestamp();
  StartTransactionCommand();
  (void)GetTransactionSnapshot();

  Relation pg_database = table_open(DatabaseRelationId, AccessShareLock);
  int capacity = 16;
  DatabaseList list{static_cast<Oid *>(MemoryContextAlloc(
                        caller_context, capacity * sizeof(Oid))),
                    0};
  TableScanDesc scan = table_beginscan_catalog(pg_database, 0, nullptr);
  HeapTuple tuple;
  while ((tuple = heap_getnext(scan, ForwardScanDirection)) != nullptr) {
    auto *form = reinterpret_cast<Form_pg_database>(GETSTRUCT(tuple));
    if (!form->datallowconn || form->datistemplate ||
        database_is_invalid_form(form))
      continue;
    if (list.count == capacity) {
      capacity *= 2;
      list.oids =
          static_cast<Oid *>(repalloc(list.oids, capacity * sizeof(Oid)));
    }
    list.oids[list.count++] = form->oid;
  }
  table_endscan(scan);
  table_close(pg_database, AccessShareLock);
  CommitTransactionCommand();
  MemoryContextSwitchTo(caller_context);
  return list;
}

void reload_settings_if_asked() {
  if (!ConfigReloadPending)
    return;
  ConfigReloadPending = false;
  ProcessConfigFile(PGC_SIGHUP);
}

// Starts the round's worker for `database` and waits until it has ended.
// Returns false when no worker could be started (all
// max_worker_processes slots taken): the round ends, the next one retries.
bool serve_database(Oid database) {
  BackgroundWorker worker;
  describe_database_worker(&worker, database, MyProcPid);
  BackgroundWorkerHandle *handle = nullptr;
  if (!RegisterDynamicBackgroundWorker(&worker, &handle)) {
    ereport(LOG,
            (errmsg("idempotency launcher could not start an expiry worker"),
             errhint("Raise max_worker_processes; the next round tries "
                     "again.")));
    return false;
  }
  pgstat_report_activity(STATE_RUNNING, "waiting for an expiry worker");
  if (WaitForBackgroundWorkerShutdown(handle) == BGWH_POSTMASTER_DIED)
    proc_exit(1);
  pfree(handle);
  status::round_abandoned(database, GetCurrentTimestamp(),
                          "the expiry worker ended before its round did");
  return true;
}

void run_round() {
  DatabaseList databases = list_databases();
  status::forget_all_but(databases.oids, databases.count);
  for (int i = 0; i < databases.count; i++) {
    CHECK_FOR_INTERRUPTS();
    reload_settings_if_asked();
    if (database_wanted_alone(databases.oids[i]))
      continue;
    if (!serve_database(databases.oids[i]))
      break;
  }
}

// An error in a round is logged and the launcher sleeps until the next one,
// rather than exiting into a restart loop.
void run_round_logging_errors(MemoryContext round_context) {
  MemoryContextSwitchTo(round_context);
  PG_TRY();
  { run_round(); }
  PG_CATCH();
  {
    MemoryContextSwitchTo(round_context);
    EmitErrorReport();
    AbortOutOfAnyTransaction();
    LockReleaseAll(DEFAULT_LOCKMETHOD, true);
    FlushErrorState();
  }
  PG_END_TRY();
  MemoryContextSwitchTo(TopMemoryContext);
  MemoryContextReset(round_context);
  pgstat_report_activity(STATE_IDLE, nullptr);
}

// What pg_stat_activity shows while the launcher sleeps between rounds.
uint32 sleep_wait_event = PG_WAIT_EXTENSION;

[[noreturn]] void launcher_loop() {
  MemoryContext round_context = AllocSetContextCreate(
      TopMemoryContext, "idempotency expiry round", ALLOCSET_DEFAULT_SIZES);
  bool ran_once = false;
  TimestampTz last_round_end = 0;
  for (;;) {
    CHECK_FOR_INTERRUPTS();
    reload_settings_if_asked();

    // 0 turns the worker off: sleep until a reload changes that.
    long interval_ms = settings::expire_interval_seconds() * 1000L;
    long sleep_ms = -1;
    if (interval_ms > 0) {
      TimestampTz now = GetCurrentTimestamp();
      TimestampTz due =
          ran_once ? TimestampTzPlusMilliseconds(last_round_end, interval_ms)
                   : now;
      if (now >= due) {
        run_round_logging_errors(round_context);
        last_round_end = GetCurrentTimestamp();
        ran_once = true;
        continue;
      }
      sleep_ms = TimestampDifferenceMilliseconds(now, due);
    }

    int events = WL_LATCH_SET | WL_EXIT_ON_PM_DEATH;
    if (sleep_ms >= 0)
      events |= WL_TIMEOUT;
    (void)WaitLatch(MyLatch, events, sleep_ms, sleep_wait_event);
    ResetLatch(MyLatch);
  }
}

} // namespace

void register_launcher() {
  BackgroundWorker worker;
  memset(&worker, 0, sizeof(worker));
  // A database connection (to none) is what lets it read pg_database.
  worker.bgw_flags =
      BGWORKER_SHMEM_ACCESS | BGWORKER_BACKEND_DATABASE_CONNECTION;
  // Not on a hot standby: the postmaster starts it at promotion.
  worker.bgw_start_time = BgWorkerStart_RecoveryFinished;
  worker.bgw_restart_time = launcher_restart_seconds;
  strlcpy(worker.bgw_library_name, "idempotency", BGW_MAXLEN);
  strlcpy(worker.bgw_function_name, "idempotency_launcher_main", BGW_MAXLEN);
  strlcpy(worker.bgw_name, launcher_type, BGW_MAXLEN);
  strlcpy(worker.bgw_type, launcher_type, BGW_MAXLEN);
  RegisterBackgroundWorker(&worker);
}

} // namespace idempotency::worker

void idempotency_launcher_main(Datum) {
  pqsignal(SIGHUP, SignalHandlerForConfigReload);
  pqsignal(SIGTERM, die);
  BackgroundWorkerUnblockSignals();
  BackgroundWorkerInitializeConnection(nullptr, nullptr, 0);
  pgstat_report_appname("idempotency launcher");
  idempotency::worker::sleep_wait_event =
      idempotency::compat::wait_event("IdempotencyLauncherSleep");
  idempotency::worker::launcher_loop();
}
