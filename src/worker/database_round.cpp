#include <algorithm>

#include "idempotency/worker/launcher.hpp"

#include "idempotency/settings/settings.hpp"
#include "idempotency/storage/key_store.hpp"
#include "idempotency/storage/keys.hpp"
#include "idempotency/storage/role_marks.hpp"
#include "idempotency/worker/expire.hpp"
#include "idempotency/worker/status.hpp"

#include "idempotency/compat.hpp"

extern "C" {
#include "access/xact.h"
#include "catalog/pg_database.h"
#include "commands/dbcommands.h"
#include "commands/trigger.h"
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

extern "C" {
PGDLLEXPORT void idempotency_database_worker_main(Datum main_arg);
}

namespace idempotency::worker {

void describe_database_worker(BackgroundWorker *worker, Oid database,
                              pid_t notify_pid) {
  memset(worker, 0, sizeof(BackgroundWorker));
  worker->bgw_flags =
      BGWORKER_SHMEM_ACCESS | BGWORKER_BACKEND_DATABASE_CONNECTION;
  worker->bgw_start_time = BgWorkerStart_RecoveryFinished;
  worker->bgw_restart_time = BGW_NEVER_RESTART;
  strlcpy(worker->bgw_library_name, "idempotency", BGW_MAXLEN);
  strlcpy(worker->bgw_function_name, "idempotency_database_worker_main",
          BGW_MAXLEN);
  snprintf(worker->bgw_name, BGW_MAXLEN, "idempotency expiry for database %u",
           database);
  strlcpy(worker->bgw_type, database_worker_type, BGW_MAXLEN);
  worker->bgw_main_arg = ObjectIdGetDatum(database);
  worker->bgw_notify_pid = notify_pid;
}

bool database_wanted_alone(Oid database) {
  LOCKTAG tag;
  SET_LOCKTAG_OBJECT(tag, InvalidOid, DatabaseRelationId, database, 0);
  if (LockAcquire(&tag, RowExclusiveLock, true, true) == LOCKACQUIRE_NOT_AVAIL)
    return true;
  LockRelease(&tag, RowExclusiveLock, true);
  return false;
}

namespace {

// What pg_stat_activity shows while a round waits to keep its pace.
uint32 pace_wait_event = PG_WAIT_EXTENSION;

void begin_transaction(const char *activity) {
  SetCurrentStatementStartTimestamp();
  StartTransactionCommand();
  PushActiveSnapshot(GetTransactionSnapshot());
  pgstat_report_activity(STATE_RUNNING, activity);
}

void commit_transaction() {
  PopActiveSnapshot();
  CommitTransactionCommand();
}

// Whether to stop the round early: when the database is wanted alone, so
// that DROP DATABASE and CREATE DATABASE ... TEMPLATE, which wait a few
// seconds for other connections to leave, find this one gone.
bool must_leave() {
  CHECK_FOR_INTERRUPTS();
  if (!database_wanted_alone(MyDatabaseId))
    return false;
  elog(DEBUG1, "idempotency expiry round stopped early: another command "
               "needs the database alone");
  return true;
}

// A round that falls behind its schedule (while it collects keys, or on a
// busy machine) catches up on at most this much of it at full speed.
constexpr int64 max_catch_up_usecs = USECS_PER_SEC / 10;
// The longest the worker sleeps without looking whether its database is
// wanted alone: DROP DATABASE and CREATE DATABASE ... TEMPLATE wait only a
// few seconds for other connections, and do not wake them.
constexpr long max_wait_ms = 100;

// idempotency.expire_rate, kept from the round's start: before each batch
// the worker waits until the keys it has handled since then (deleted or
// skipped) are no more than the rate allows for the time elapsed.
struct Pace {
  int rate; // keys per second; 0: no limit
  TimestampTz since;
  int64 keys;
};
static_assert(std::is_trivially_destructible_v<Pace>);

Pace start_pace() {
  return Pace{settings::expire_rate(), GetCurrentTimestamp(), 0};
}

// A reload (SIGHUP) applies a new idempotency.expire_rate from
// postgresql.conf to the running round, counted from the reload on.
void reload_settings_if_asked(Pace *pace) {
  if (!ConfigReloadPending)
    return;
  ConfigReloadPending = false;
  ProcessConfigFile(PGC_SIGHUP);
  if (settings::expire_rate() != pace->rate)
    *pace = start_pace();
}

// How long to wait before the next batch, in microseconds; 0: go on now.
int64 wait_before_next_batch(Pace *pace) {
  if (pace->rate == 0)
    return 0;
  TimestampTz now = GetCurrentTimestamp();
  TimestampTz due =
      pace->since + pace->keys * USECS_PER_SEC / static_cast<int64>(pace->rate);
  if (due > now)
    return due - now;
  // Behind schedule: forget what is more than max_catch_up_usecs late, so
  // that the round never runs flat out for long to make up for it.
  if (now - due > max_catch_up_usecs)
    pace->since += now - due - max_catch_up_usecs;
  return 0;
}

// Waits for the next batch's turn under idempotency.expire_rate. Every wake
// (its time come, SIGTERM, a barrier that DROP DATABASE waits for, a
// reload, any other signal) first checks must_leave(); false when the round
// must stop.
bool wait_for_turn(Pace *pace) {
  for (;;) {
    if (must_leave())
      return false;
    reload_settings_if_asked(pace);
    int64 wait_usecs = wait_before_next_batch(pace);
    if (wait_usecs == 0)
      return true;
    long wait_ms =
        std::min(max_wait_ms, static_cast<long>((wait_usecs + 999) / 1000));
    (void)WaitLatch(MyLatch, WL_LATCH_SET | WL_TIMEOUT | WL_EXIT_ON_PM_DEATH,
                    wait_ms, pace_wait_event);
    ResetLatch(MyLatch);
  }
}

enum class RoundEnd { finished, left_early, extension_dropped, gave_way };

// What the round has done so far; kept in the worker's memory, so that it
// is still there after an error.
struct RoundTally {
  MemoryContext context;
  int64 deleted;
  int64 kept;
  const char *kept_reason; // the first refusal, in `context`
};
static_assert(std::is_trivially_destructible_v<RoundTally>);

// Moves the rows a store kept since the last call into the tally.
void tally_kept(storage::ExpiryRound &round, RoundTally *tally) {
  if (round.kept == 0)
    return;
  if (tally->kept_reason == nullptr)
    tally->kept_reason = MemoryContextStrdup(tally->context, round.kept_reason);
  tally->kept += round.kept;
  round.kept = 0;
}

// Starts a transaction of the round holding idempotency.keys in `mode`;
// false (and no transaction) when the extension was dropped meanwhile.
bool begin_round_transaction(const char *activity, LOCKMODE mode) {
  begin_transaction(activity);
  if (storage::lock_key_table(mode))
    return true;
  commit_transaction();
  elog(DEBUG1, "idempotency expiry round stopped: the extension was dropped");
  return false;
}

// SET CONSTRAINTS ALL IMMEDIATE for the transaction: a DBA's deferred
// constraint (trigger) on the key table then checks each tombstone as it is
// written, where a refusal is that row's (storage::KeyStore::expire_batch
// keeps it), and not at the commit, where it would undo the whole batch
// every round.
void check_constraints_at_once() {
  ConstraintsSetStmt *all_immediate = makeNode(ConstraintsSetStmt);
  all_immediate->constraints = NIL;
  all_immediate->deferred = false;
  AfterTriggerSetState(all_immediate);
}

// Runs the round in one key store: passes until no expired key is left;
// each collects keys in a read-only transaction, then deletes them in
// batches of idempotency.expire_batch_size, each batch its own short
// transaction, at most idempotency.expire_rate keys a second (where the
// store's batches are paced). The store keeps its work in `context`.
RoundEnd run_passes(const storage::KeyStore &store, TimestampTz cutoff,
                    MemoryContext context, Pace *pace, RoundTally *tally) {
  // Marks made again where they are missing (pg_upgrade does not carry
  // them), and keys of roles that no longer exist deleted.
  if (!begin_round_transaction("marking the roles that have idempotency keys",
                               RowExclusiveLock))
    return RoundEnd::extension_dropped;
  if (storage::role_marks::database_marks_roles())
    tally->deleted += storage::role_marks::mark_key_roles();
  commit_transaction();

  int batch_size = settings::expire_batch_size();
  storage::ExpiryRound round = begin_expiry(cutoff, context);
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
      check_constraints_at_once();
      ExpiryBatch batch = expire_batch(store, round, batch_size);
      tally->deleted += batch.deleted;
      commit_transaction();
      tally_kept(round, tally);
      if (round.paced)
        pace->keys += batch.handled;
    }
  } while (!round.finished);
  return RoundEnd::finished;
}

// Runs the round in every key store (storage::expiry_store): the local
// table, then the tenant keys of the Citus coordinator, which one DELETE
// expires on every shard, where the shard is now.
RoundEnd run_stores(TimestampTz cutoff, MemoryContext pass_context,
                    RoundTally *tally) {
  Pace pace = start_pace();
  for (int i = 0; i < storage::key_backend_count; i++) {
    RoundEnd end = run_passes(storage::expiry_store(i), cutoff, pass_context,
                              &pace, tally);
    MemoryContextReset(pass_context);
    if (end != RoundEnd::finished)
      return end;
  }
  return RoundEnd::finished;
}

enum class RoundStart { no_extension, keys_in_citus, ready };

// Logs a round that deletes nothing because Citus has taken
// idempotency.keys over: the keys are in its shards, and the local table is
// not theirs to expire (calls refuse the table too). In a transaction.
void warn_keys_in_citus(const char *reason) {
  ereport(WARNING,
          (errmsg("idempotency expiry skipped database \"%s\": %s",
                  get_database_name(MyDatabaseId), reason),
           errhint("Make idempotency.keys a local table again with the steps "
                   "in the extension's docs/scale-out.md.")));
}

// Looks up whether the extension is installed and, if so, the round's
// cutoff; without the extension the database is left alone, silently.
// `skipped` is the reason when Citus has taken idempotency.keys over.
RoundStart prepare_round(TimestampTz started, TimestampTz *cutoff,
                         const char **skipped, const char **database_name) {
  SetCurrentStatementStartTimestamp();
  StartTransactionCommand();
  RoundStart start = RoundStart::no_extension;
  // For the log, when the round ends outside a transaction.
  *database_name =
      MemoryContextStrdup(TopMemoryContext, get_database_name(MyDatabaseId));
  if (extension_installed()) {
    storage::citus::TableKind kind = storage::key_table_citus_kind();
    start = RoundStart::ready;
    if (kind != storage::citus::TableKind::not_citus) {
      *skipped = storage::citus::citus_table_message(kind);
      warn_keys_in_citus(*skipped);
      start = RoundStart::keys_in_citus;
    }
  }
  if (start == RoundStart::ready)
    *cutoff = expiry_cutoff(started);
  CommitTransactionCommand();
  return start;
}

// Errors a round gives way to rather than fails with: a lock or statement
// timeout (a lock_timeout set for the database, while a DBA holds the key
// table), a cancel, a deadlock. The next round tries again.
bool gives_way_to(const ErrorData *error) {
  switch (error->sqlerrcode) {
  case ERRCODE_LOCK_NOT_AVAILABLE:
  case ERRCODE_QUERY_CANCELED:
  case ERRCODE_T_R_DEADLOCK_DETECTED:
  case ERRCODE_T_R_SERIALIZATION_FAILURE:
    return true;
  default:
    return false;
  }
}

// Ends the round's transaction after an error it gave way to, and says so
// in the log; returns what the status records as the round's error.
const char *give_way(const ErrorData *error, const char *database_name) {
  AbortOutOfAnyTransaction();
  ereport(LOG, (errcode(error->sqlerrcode),
                errmsg("idempotency expiry skipped the rest of its round in "
                       "database \"%s\": %s",
                       database_name, error->message),
                errhint("The next round tries again.")));
  return psprintf("round skipped: %s (SQLSTATE %s)", error->message,
                  unpack_sql_state(error->sqlerrcode));
}

status::RoundShortfall shortfall_of(const RoundTally *tally, bool skipped) {
  return status::RoundShortfall{skipped, tally->kept, tally->kept_reason};
}

void run_round() {
  Oid database = MyDatabaseId;
  TimestampTz started = GetCurrentTimestamp();
  TimestampTz cutoff = 0;
  const char *skipped_by_citus = nullptr;
  const char *database_name = nullptr;
  switch (prepare_round(started, &cutoff, &skipped_by_citus, &database_name)) {
  case RoundStart::no_extension:
    status::forget(database);
    return;
  case RoundStart::keys_in_citus:
    // Recorded as a failed round, so that monitoring on expiry_status sees
    // that keys no longer expire here.
    status::round_started(database, started);
    status::round_finished(database, GetCurrentTimestamp(), 0,
                           skipped_by_citus);
    return;
  case RoundStart::ready:
    break;
  }
  status::round_started(database, started);

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
  { end = run_stores(cutoff, pass_context, tally); }
  PG_CATCH();
  {
    MemoryContextSwitchTo(context);
    ErrorData *error = CopyErrorData();
    if (!gives_way_to(error)) {
      // Record the error, then let the worker's own error handling log it
      // and end the process; the launcher goes on with the next database.
      status::round_finished(database, GetCurrentTimestamp(), tally->deleted,
                             error->message, shortfall_of(tally, false));
      PG_RE_THROW();
    }
    FlushErrorState();
    skipped = give_way(error, database_name);
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
    status::round_finished(database, GetCurrentTimestamp(), tally->deleted,
                           skipped, shortfall_of(tally, skipped != nullptr));
}

} // namespace

} // namespace idempotency::worker

void idempotency_database_worker_main(Datum main_arg) {
  pqsignal(SIGHUP, SignalHandlerForConfigReload);
  pqsignal(SIGTERM, die);
  BackgroundWorkerUnblockSignals();
  BackgroundWorkerInitializeConnectionByOid(DatumGetObjectId(main_arg),
                                            InvalidOid, 0);
  pgstat_report_appname(idempotency::worker::database_worker_type);
  idempotency::worker::pace_wait_event =
      idempotency::compat::wait_event("IdempotencyExpiryPace");
  // No batch waits for its commit to reach the disk: the WAL writer
  // flushes it soon after, and a crash that loses it loses only deletions
  // that a later round makes again. Callers meanwhile flush their own
  // commits without queueing behind the worker's.
  SetConfigOption("synchronous_commit", "off", PGC_SUSET, PGC_S_OVERRIDE);
  idempotency::worker::run_round();
  proc_exit(0);
}
