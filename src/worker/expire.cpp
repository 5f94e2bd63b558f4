// The launcher connects to no database, so that it never stands in the way
// of DROP DATABASE, and starts a short-lived worker in each database in
// turn, which leaves early when a command waits to have the database alone.
#include <algorithm>
#include <climits>

#include "idempotency/worker/expire.hpp"

#include "idempotency/settings/settings.hpp"
#include "idempotency/stats/stats.hpp"
#include "idempotency/storage/key_store.hpp"
#include "idempotency/storage/keys.hpp"
#include "idempotency/storage/role_marks.hpp"
#include "idempotency/worker/status.hpp"

#include "idempotency/compat.hpp"

extern "C" {
#include "access/heapam.h"
#include "access/xact.h"
#include "catalog/pg_database.h"
#include "commands/dbcommands.h"
#include "commands/extension.h"
#include "commands/trigger.h"
#include "miscadmin.h"
#include "postmaster/bgworker.h"
#include "postmaster/interrupt.h"
#include "storage/ipc.h"
#include "storage/latch.h"
#include "storage/lock.h"
#include "tcop/tcopprot.h"
#include "utils/backend_status.h"
#include "utils/lsyscache.h"
#include "utils/memutils.h"
#include "utils/snapmgr.h"
#include "utils/wait_event.h"
}

namespace idempotency::worker {

namespace {

// `now`, or the start of an older transaction here that may call: a call
// compares expires_at with its transaction's start. Only COMMIT PREPARED
// commits an expired key (storage/commit_guard.hpp), deleted like any other.
TimestampTz expiry_cutoff(TimestampTz now) {
  TimestampTz cutoff = now;
  int backends = pgstat_fetch_stat_numbackends();
  for (int i = 1; i <= backends; i++) {
    LocalPgBackendStatus *local = compat::pgstat_get_local_beentry_by_index(i);
    if (local == nullptr)
      continue;
    const PgBackendStatus &backend = local->backendStatus;
    // Only sessions and background workers can call idempotent_call.
    bool may_call = backend.st_backendType == B_BACKEND ||
                    backend.st_backendType == B_BG_WORKER;
    if (!may_call || backend.st_databaseid != MyDatabaseId ||
        backend.st_procpid == MyProcPid)
      continue;
    TimestampTz started = backend.st_xact_start_timestamp;
    if (started != 0 && started < cutoff)
      cutoff = started;
  }
  return cutoff;
}

void warn_kept_rows(const char *database, int64 kept, const char *reason) {
  ereport(WARNING,
          (errmsg("idempotency expiry kept " INT64_FORMAT
                  " expired keys of database \"%s\": their tombstones "
                  "could not be written",
                  kept, database),
           errdetail("The first refusal: %s", reason),
           errhint("A constraint, index or trigger on idempotency.keys "
                   "refuses tombstones (see the extension's "
                   "docs/maintenance.md). The keys are still refused to "
                   "retries until their window ends; change or drop that "
                   "object and the next round expires them.")));
}

bool reload_settings_if_asked() {
  if (!ConfigReloadPending)
    return false;
  ConfigReloadPending = false;
  ProcessConfigFile(PGC_SIGHUP);
  return true;
}

constexpr const char *database_worker_type = "idempotency expiry";

BackgroundWorker describe_worker(const char *function, const char *type,
                                 int restart_seconds) {
  BackgroundWorker worker{};
  // A connection (to none, for the launcher) lets it read pg_database.
  worker.bgw_flags =
      BGWORKER_SHMEM_ACCESS | BGWORKER_BACKEND_DATABASE_CONNECTION;
  // Not on a hot standby: the postmaster starts it at promotion.
  worker.bgw_start_time = BgWorkerStart_RecoveryFinished;
  worker.bgw_restart_time = restart_seconds;
  strlcpy(worker.bgw_library_name, "idempotency", BGW_MAXLEN);
  strlcpy(worker.bgw_function_name, function, BGW_MAXLEN);
  strlcpy(worker.bgw_name, type, BGW_MAXLEN);
  strlcpy(worker.bgw_type, type, BGW_MAXLEN);
  return worker;
}

// DROP DATABASE and the like hold a lock that conflicts with the one every
// new connection takes. Works outside transactions.
bool database_wanted_alone(Oid database) {
  LOCKTAG tag;
  SET_LOCKTAG_OBJECT(tag, InvalidOid, DatabaseRelationId, database, 0);
  if (LockAcquire(&tag, RowExclusiveLock, true, true) == LOCKACQUIRE_NOT_AVAIL)
    return true;
  LockRelease(&tag, RowExclusiveLock, true);
  return false;
}

// --- a round in one database, by a short-lived worker ------------------------

uint32 pace_wait_event = PG_WAIT_EXTENSION;

void commit_transaction() {
  PopActiveSnapshot();
  CommitTransactionCommand();
}

// DROP DATABASE and CREATE DATABASE ... TEMPLATE wait only a few seconds
// for other connections to leave, and do not wake them.
bool must_leave() {
  CHECK_FOR_INTERRUPTS();
  if (!database_wanted_alone(MyDatabaseId))
    return false;
  elog(DEBUG1, "idempotency expiry round stopped early: another command "
               "needs the database alone");
  return true;
}

// A round behind its schedule catches up on at most this much at full
// speed; it checks must_leave() at least this often.
constexpr int64 max_catch_up_usecs = USECS_PER_SEC / 10;
constexpr long max_wait_ms = 100;

// idempotency.expire_rate: keys handled (deleted or skipped) since `since`.
struct Pace {
  int rate; // keys per second; 0: no limit
  TimestampTz since;
  int64 keys;
};
static_assert(std::is_trivially_destructible_v<Pace>);

// False when the round must stop.
bool wait_for_turn(Pace *pace) {
  for (;;) {
    if (must_leave())
      return false;
    // A new rate applies to the running round, counted from the reload on.
    if (reload_settings_if_asked() && settings::expire_rate() != pace->rate)
      *pace = {settings::expire_rate(), GetCurrentTimestamp(), 0};
    if (pace->rate == 0)
      return true;
    TimestampTz now = GetCurrentTimestamp();
    TimestampTz due = pace->since + pace->keys * USECS_PER_SEC /
                                        static_cast<int64>(pace->rate);
    if (due <= now) {
      if (now - due > max_catch_up_usecs)
        pace->since += now - due - max_catch_up_usecs;
      return true;
    }
    long wait_ms =
        std::min(max_wait_ms, static_cast<long>((due - now + 999) / 1000));
    (void)WaitLatch(MyLatch, WL_LATCH_SET | WL_TIMEOUT | WL_EXIT_ON_PM_DEATH,
                    wait_ms, pace_wait_event);
    ResetLatch(MyLatch);
  }
}

enum class RoundEnd { finished, left_early, extension_dropped, gave_way };

// In the worker's memory, so that it survives an error.
struct RoundTally {
  MemoryContext context;
  int64 deleted;
  int64 kept;
  const char *kept_reason; // the first refusal, in `context`
};
static_assert(std::is_trivially_destructible_v<RoundTally>);

void tally_kept(storage::ExpiryRound &round, RoundTally *tally) {
  if (round.kept == 0)
    return;
  if (tally->kept_reason == nullptr)
    tally->kept_reason = MemoryContextStrdup(tally->context, round.kept_reason);
  tally->kept += round.kept;
  round.kept = 0;
}

// False, with no transaction, when the extension was dropped meanwhile.
bool begin_round_transaction(const char *activity, LOCKMODE mode) {
  SetCurrentStatementStartTimestamp();
  StartTransactionCommand();
  PushActiveSnapshot(GetTransactionSnapshot());
  pgstat_report_activity(STATE_RUNNING, activity);
  if (storage::lock_key_table(mode))
    return true;
  commit_transaction();
  elog(DEBUG1, "idempotency expiry round stopped: the extension was dropped");
  return false;
}

// A pass collects keys read-only, then deletes a batch per short transaction.
RoundEnd run_passes(const storage::KeyStore &store, TimestampTz cutoff,
                    MemoryContext context, Pace *pace, RoundTally *tally) {
  // pg_upgrade does not carry the marks; keys of dropped roles go.
  if (!begin_round_transaction("marking the roles that have idempotency keys",
                               RowExclusiveLock))
    return RoundEnd::extension_dropped;
  if (storage::role_marks::database_marks_roles())
    tally->deleted += storage::role_marks::mark_key_roles();
  commit_transaction();
  int batch_size = settings::expire_batch_size();
  storage::ExpiryRound round{cutoff, context, nullptr, false,
                             false,  true,    0,       nullptr};
  do {
    if (must_leave())
      return RoundEnd::left_early;
    if (!begin_round_transaction("collecting expired idempotency keys",
                                 AccessShareLock))
      return RoundEnd::extension_dropped;
    store.collect_expired(round, batch_size);
    commit_transaction();
    while (round.has_batch) {
      if (round.paced ? !wait_for_turn(pace) : must_leave())
        return RoundEnd::left_early;
      if (!begin_round_transaction("deleting expired idempotency keys",
                                   RowExclusiveLock))
        return RoundEnd::extension_dropped;
      // SET CONSTRAINTS ALL IMMEDIATE (makeNode's zeroes): a deferred
      // constraint then refuses a tombstone as it is written (that row is
      // kept), not at commit, which would undo the whole batch every round.
      AfterTriggerSetState(makeNode(ConstraintsSetStmt));
      storage::ExpiryBatch batch = store.expire_batch(round, batch_size);
      stats::count_expired(batch.deleted);
      tally->deleted += batch.deleted;
      commit_transaction();
      tally_kept(round, tally);
      if (round.paced)
        pace->keys += batch.handled;
    }
  } while (!round.finished);
  return RoundEnd::finished;
}

// --- the launcher: one round per database -----------------------------------

constexpr const char *launcher_type = "idempotency launcher";
constexpr int launcher_restart_seconds = 5;

// An error is logged rather than exiting into a restart loop. A connection
// to a template would hold up CREATE DATABASE.
void run_launcher_round(MemoryContext round_context) {
  MemoryContextSwitchTo(round_context);
  PG_TRY();
  {
    SetCurrentStatementStartTimestamp();
    StartTransactionCommand();
    (void)GetTransactionSnapshot();
    MemoryContextSwitchTo(round_context);
    Relation pg_database = table_open(DatabaseRelationId, AccessShareLock);
    List *databases = NIL;
    TableScanDesc scan = table_beginscan_catalog(pg_database, 0, nullptr);
    HeapTuple tuple;
    while ((tuple = heap_getnext(scan, ForwardScanDirection)) != nullptr) {
      auto *form = reinterpret_cast<Form_pg_database>(GETSTRUCT(tuple));
      if (form->datallowconn && !form->datistemplate &&
          !database_is_invalid_form(form))
        databases = lappend_oid(databases, form->oid);
    }
    table_endscan(scan);
    table_close(pg_database, AccessShareLock);
    CommitTransactionCommand();
    MemoryContextSwitchTo(round_context);
    status::forget_all_but(databases);
    ListCell *cell;
    foreach (cell, databases) {
      Oid database = lfirst_oid(cell);
      CHECK_FOR_INTERRUPTS();
      (void)reload_settings_if_asked();
      if (database_wanted_alone(database))
        continue;
      BackgroundWorker worker =
          describe_worker("idempotency_database_worker_main",
                          database_worker_type, BGW_NEVER_RESTART);
      snprintf(worker.bgw_name, BGW_MAXLEN,
               "idempotency expiry for database %u", database);
      worker.bgw_main_arg = ObjectIdGetDatum(database);
      worker.bgw_notify_pid = MyProcPid;
      BackgroundWorkerHandle *handle = nullptr;
      if (!RegisterDynamicBackgroundWorker(&worker, &handle)) {
        ereport(LOG,
                (errmsg("idempotency launcher could not start an expiry "
                        "worker"),
                 errhint("Raise max_worker_processes; the next round tries "
                         "again.")));
        break;
      }
      pgstat_report_activity(STATE_RUNNING, "waiting for an expiry worker");
      if (WaitForBackgroundWorkerShutdown(handle) == BGWH_POSTMASTER_DIED)
        proc_exit(1);
      status::round_abandoned(database,
                              "the expiry worker ended before its round did");
    }
  }
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

} // namespace

void register_launcher() {
  BackgroundWorker worker = describe_worker(
      "idempotency_launcher_main", launcher_type, launcher_restart_seconds);
  RegisterBackgroundWorker(&worker);
}

int64 expire_now() {
  TimestampTz cutoff = expiry_cutoff(GetCurrentTransactionStartTimestamp());
  int batch_size = settings::expire_batch_size();
  RoundTally tally{CurrentMemoryContext, 0, 0, nullptr};
  for (storage::KeyTableKind kind : storage::key_table_kinds) {
    storage::KeyStore store = storage::store_of_kind(kind);
    MemoryContext context =
        AllocSetContextCreate(CurrentMemoryContext, "idempotency expiry pass",
                              ALLOCSET_DEFAULT_SIZES);
    storage::ExpiryRound round{cutoff, context, nullptr, false,
                               false,  true,    0,       nullptr};
    do {
      store.collect_expired(round, batch_size);
      while (round.has_batch) {
        int64 deleted = store.expire_batch(round, INT_MAX).deleted;
        stats::count_expired(deleted);
        tally.deleted += deleted;
      }
    } while (!round.finished);
    tally_kept(round, &tally);
    MemoryContextDelete(context);
  }
  if (tally.kept > 0)
    warn_kept_rows(get_database_name(MyDatabaseId), tally.kept,
                   tally.kept_reason);
  return tally.deleted;
}

extern "C" PGDLLEXPORT void idempotency_launcher_main(Datum) {
  pqsignal(SIGHUP, SignalHandlerForConfigReload);
  pqsignal(SIGTERM, die);
  BackgroundWorkerUnblockSignals();
  BackgroundWorkerInitializeConnection(nullptr, nullptr, 0);
  pgstat_report_appname(launcher_type);
  uint32 sleep_wait_event = compat::wait_event("IdempotencyLauncherSleep");
  MemoryContext round_context = AllocSetContextCreate(
      TopMemoryContext, "idempotency expiry round", ALLOCSET_DEFAULT_SIZES);
  TimestampTz last_round_end = 0; // 0: no round yet
  for (;;) {
    CHECK_FOR_INTERRUPTS();
    (void)reload_settings_if_asked();
    // 0 turns the worker off: sleep until a reload changes that.
    long interval_ms = settings::expire_interval_seconds() * 1000L;
    long sleep_ms = -1;
    if (interval_ms > 0) {
      TimestampTz now = GetCurrentTimestamp();
      TimestampTz due =
          last_round_end != 0
              ? TimestampTzPlusMilliseconds(last_round_end, interval_ms)
              : now;
      if (now >= due) {
        run_launcher_round(round_context);
        last_round_end = GetCurrentTimestamp();
        continue;
      }
      sleep_ms = TimestampDifferenceMilliseconds(now, due);
    }
    (void)WaitLatch(MyLatch,
                    WL_LATCH_SET | WL_EXIT_ON_PM_DEATH |
                        (sleep_ms >= 0 ? WL_TIMEOUT : 0),
                    sleep_ms, sleep_wait_event);
    ResetLatch(MyLatch);
  }
}

extern "C" PGDLLEXPORT void idempotency_database_worker_main(Datum main_arg) {
  pqsignal(SIGHUP, SignalHandlerForConfigReload);
  pqsignal(SIGTERM, die);
  BackgroundWorkerUnblockSignals();
  BackgroundWorkerInitializeConnectionByOid(DatumGetObjectId(main_arg),
                                            InvalidOid, 0);
  pgstat_report_appname(database_worker_type);
  pace_wait_event = compat::wait_event("IdempotencyExpiryPace");
  // A crash loses only deletions a later round makes again, and callers
  // flush their commits without queueing behind the worker's.
  SetConfigOption("synchronous_commit", "off", PGC_SUSET, PGC_S_OVERRIDE);
  Oid database = MyDatabaseId;
  TimestampTz started = GetCurrentTimestamp();
  TimestampTz cutoff = 0;
  SetCurrentStatementStartTimestamp();
  StartTransactionCommand();
  // For the log, when the round ends outside a transaction.
  const char *database_name =
      MemoryContextStrdup(TopMemoryContext, get_database_name(database));
  bool installed = OidIsValid(get_extension_oid("idempotency", true));
  storage::citus::TableKind kind = installed
                                       ? storage::key_table_citus_kind()
                                       : storage::citus::TableKind::not_citus;
  // A table Citus took over is not the round's to expire: recorded as
  // failed, monitoring sees that keys no longer expire.
  const char *taken_over = nullptr;
  if (kind != storage::citus::TableKind::not_citus) {
    taken_over = storage::citus::citus_table_message(kind);
    ereport(WARNING,
            (errmsg("idempotency expiry skipped database \"%s\": %s",
                    database_name, taken_over),
             errhint("Make idempotency.keys a local table again with the "
                     "steps in the extension's docs/scale-out.md.")));
  } else if (installed) {
    cutoff = expiry_cutoff(started);
  }
  CommitTransactionCommand();
  if (!installed) {
    status::forget(database);
    return;
  }
  status::round_started(database, started);
  if (taken_over != nullptr) {
    status::round_finished(database, 0, taken_over);
    return;
  }
  // Read after an error; volatile so the longjmp keeps its value.
  volatile RoundEnd end = RoundEnd::finished;
  const char *volatile skipped = nullptr;
  MemoryContext context = CurrentMemoryContext;
  auto *tally = static_cast<RoundTally *>(
      MemoryContextAllocZero(context, sizeof(RoundTally)));
  tally->context = context;
  MemoryContext pass_context = AllocSetContextCreate(
      context, "idempotency expiry pass", ALLOCSET_DEFAULT_SIZES);
  PG_TRY();
  {
    // The local table, then the Citus coordinator's tenant keys.
    Pace pace{settings::expire_rate(), GetCurrentTimestamp(), 0};
    for (storage::KeyTableKind kind : storage::key_table_kinds) {
      if (end != RoundEnd::finished)
        break;
      end = run_passes(storage::store_of_kind(kind), cutoff, pass_context,
                       &pace, tally);
      MemoryContextReset(pass_context);
    }
  }
  PG_CATCH();
  {
    MemoryContextSwitchTo(context);
    ErrorData *error = CopyErrorData();
    // The next round tries again after a lock_timeout while a DBA holds the
    // key table, a cancel or a deadlock.
    int code = error->sqlerrcode;
    if (code != ERRCODE_LOCK_NOT_AVAILABLE && code != ERRCODE_QUERY_CANCELED &&
        code != ERRCODE_T_R_DEADLOCK_DETECTED &&
        code != ERRCODE_T_R_SERIALIZATION_FAILURE) {
      // The worker's error handling logs it and ends the process.
      status::round_finished(database, tally->deleted, error->message, false,
                             tally->kept, tally->kept_reason);
      PG_RE_THROW();
    }
    FlushErrorState();
    AbortOutOfAnyTransaction();
    ereport(LOG, (errcode(error->sqlerrcode),
                  errmsg("idempotency expiry skipped the rest of its round in "
                         "database \"%s\": %s",
                         database_name, error->message),
                  errhint("The next round tries again.")));
    skipped = psprintf("round skipped: %s (SQLSTATE %s)", error->message,
                       unpack_sql_state(error->sqlerrcode));
    end = RoundEnd::gave_way;
  }
  PG_END_TRY();
  MemoryContextDelete(pass_context);
  pgstat_report_activity(STATE_IDLE, nullptr);
  if (tally->kept > 0)
    warn_kept_rows(database_name, tally->kept, tally->kept_reason);
  // As when the extension was not installed at the start of the round.
  if (end == RoundEnd::extension_dropped)
    status::forget(database);
  else
    status::round_finished(database, tally->deleted, skipped,
                           skipped != nullptr, tally->kept, tally->kept_reason);
}

} // namespace idempotency::worker
