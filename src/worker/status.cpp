#include "idempotency/worker/status.hpp"

extern "C" {
#include "funcapi.h"
#include "mb/pg_wchar.h"
#include "storage/lwlock.h"
#include "storage/shmem.h"
#include "utils/builtins.h"
#include "utils/timestamp.h"
}

namespace idempotency::worker::status {

namespace {

// Databases with the extension installed that the status remembers; beyond
// that, the least recently served one is forgotten.
constexpr int max_databases = 256;
constexpr int max_error_bytes = 256;

struct DatabaseRounds {
  Oid database; // InvalidOid: a free slot
  bool running;
  TimestampTz running_since;
  TimestampTz last_started;
  TimestampTz last_finished;
  int64 last_deleted;
  bool last_failed;
  char last_error[max_error_bytes];
  int64 rounds;
  int64 total_deleted;
  int64 failed_rounds;
};

struct SharedStatus {
  slock_t mutex;
  DatabaseRounds databases[max_databases];
};

SharedStatus *shared = nullptr;

// Callers hold the mutex. Never fails: when every slot is taken, the one
// whose last round is oldest is reused.
DatabaseRounds &slot_for(Oid database) {
  DatabaseRounds *free_slot = nullptr;
  DatabaseRounds *oldest = &shared->databases[0];
  for (DatabaseRounds &slot : shared->databases) {
    if (slot.database == database)
      return slot;
    if (slot.database == InvalidOid && free_slot == nullptr)
      free_slot = &slot;
    if (slot.last_finished < oldest->last_finished)
      oldest = &slot;
  }
  DatabaseRounds &slot = free_slot != nullptr ? *free_slot : *oldest;
  memset(&slot, 0, sizeof(slot));
  slot.database = database;
  return slot;
}

// Must run outside the spinlock: clipping may call into the encoding
// routines.
int clipped_length(const char *error) {
  return pg_mbcliplen(error, strlen(error), max_error_bytes - 1);
}

void finish(DatabaseRounds &slot, TimestampTz at, int64 deleted,
            const char *error, int error_length) {
  slot.running = false;
  slot.last_started = slot.running_since;
  slot.last_finished = at;
  slot.last_deleted = deleted;
  slot.last_failed = error != nullptr;
  slot.last_error[0] = '\0';
  if (error != nullptr) {
    memcpy(slot.last_error, error, error_length);
    slot.last_error[error_length] = '\0';
  }
  slot.rounds++;
  slot.total_deleted += deleted;
  if (error != nullptr)
    slot.failed_rounds++;
}

} // namespace

void request_shared_memory() {
  RequestAddinShmemSpace(MAXALIGN(sizeof(SharedStatus)));
}

void attach_shared_memory() {
  LWLockAcquire(AddinShmemInitLock, LW_EXCLUSIVE);
  bool found = false;
  shared = static_cast<SharedStatus *>(ShmemInitStruct(
      "idempotency expiry status", sizeof(SharedStatus), &found));
  if (!found) {
    memset(shared, 0, sizeof(SharedStatus));
    SpinLockInit(&shared->mutex);
  }
  LWLockRelease(AddinShmemInitLock);
}

void round_started(Oid database, TimestampTz at) {
  if (shared == nullptr)
    return;
  SpinLockAcquire(&shared->mutex);
  DatabaseRounds &slot = slot_for(database);
  slot.running = true;
  slot.running_since = at;
  SpinLockRelease(&shared->mutex);
}

void round_finished(Oid database, TimestampTz at, int64 deleted,
                    const char *error) {
  if (shared == nullptr)
    return;
  int error_length = error != nullptr ? clipped_length(error) : 0;
  SpinLockAcquire(&shared->mutex);
  finish(slot_for(database), at, deleted, error, error_length);
  SpinLockRelease(&shared->mutex);
}

void round_abandoned(Oid database, TimestampTz at, const char *error) {
  if (shared == nullptr)
    return;
  int error_length = clipped_length(error);
  SpinLockAcquire(&shared->mutex);
  for (DatabaseRounds &slot : shared->databases)
    if (slot.database == database && slot.running)
      finish(slot, at, 0, error, error_length);
  SpinLockRelease(&shared->mutex);
}

void forget(Oid database) {
  if (shared == nullptr)
    return;
  SpinLockAcquire(&shared->mutex);
  for (DatabaseRounds &slot : shared->databases)
    if (slot.database == database)
      memset(&slot, 0, sizeof(slot));
  SpinLockRelease(&shared->mutex);
}

void forget_all_but(const Oid *databases, int count) {
  if (shared == nullptr)
    return;
  SpinLockAcquire(&shared->mutex);
  for (DatabaseRounds &slot : shared->databases) {
    bool listed = false;
    for (int i = 0; i < count && !listed; i++)
      listed = databases[i] == slot.database;
    if (!listed)
      memset(&slot, 0, sizeof(slot));
  }
  SpinLockRelease(&shared->mutex);
}

namespace {

enum StatusColumn {
  col_datid,
  col_running_since,
  col_last_started,
  col_last_finished,
  col_last_deleted,
  col_last_error,
  col_rounds,
  col_total_deleted,
  col_failed_rounds,
  status_columns
};

Datum timestamp_or_null(TimestampTz at, bool *isnull) {
  *isnull = at == 0;
  return TimestampTzGetDatum(at);
}

void put_row(ReturnSetInfo *rsinfo, const DatabaseRounds &slot) {
  Datum values[status_columns];
  bool nulls[status_columns] = {};
  bool finished = slot.last_finished != 0;
  values[col_datid] = ObjectIdGetDatum(slot.database);
  values[col_running_since] = timestamp_or_null(
      slot.running ? slot.running_since : 0, &nulls[col_running_since]);
  values[col_last_started] =
      timestamp_or_null(slot.last_started, &nulls[col_last_started]);
  values[col_last_finished] =
      timestamp_or_null(slot.last_finished, &nulls[col_last_finished]);
  values[col_last_deleted] = Int64GetDatum(slot.last_deleted);
  nulls[col_last_deleted] = !finished;
  values[col_last_error] =
      slot.last_failed ? CStringGetTextDatum(slot.last_error) : (Datum)0;
  nulls[col_last_error] = !slot.last_failed;
  values[col_rounds] = Int64GetDatum(slot.rounds);
  values[col_total_deleted] = Int64GetDatum(slot.total_deleted);
  values[col_failed_rounds] = Int64GetDatum(slot.failed_rounds);
  tuplestore_putvalues(rsinfo->setResult, rsinfo->setDesc, values, nulls);
}

} // namespace

Datum expiry_status_body(FunctionCallInfo fcinfo) {
  if (shared == nullptr)
    ereport(ERROR, (errcode(ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE),
                    errmsg("the idempotency expiry worker is not running"),
                    errhint("Add idempotency to shared_preload_libraries and "
                            "restart the server.")));
  InitMaterializedSRF(fcinfo, 0);
  auto *rsinfo = reinterpret_cast<ReturnSetInfo *>(fcinfo->resultinfo);

  // Copy first: no palloc (which may fail) while the spinlock is held.
  auto *copy = static_cast<DatabaseRounds *>(
      palloc(sizeof(DatabaseRounds) * max_databases));
  SpinLockAcquire(&shared->mutex);
  memcpy(copy, shared->databases, sizeof(DatabaseRounds) * max_databases);
  SpinLockRelease(&shared->mutex);

  for (int i = 0; i < max_databases; i++)
    if (copy[i].database != InvalidOid)
      put_row(rsinfo, copy[i]);
  return (Datum)0;
}

} // namespace idempotency::worker::status
