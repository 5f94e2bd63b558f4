#include "idempotency/worker/status.hpp"

extern "C" {
#include "mb/pg_wchar.h"
#include "storage/lwlock.h"
#include "storage/shmem.h"
#include "storage/spin.h"
#include "utils/timestamp.h"
}

namespace idempotency::worker::status {

namespace {

struct SharedStatus {
  slock_t mutex;
  RoundStatus databases[max_databases];
};

SharedStatus *shared = nullptr;

// Callers hold the mutex. Reuses the slot of the oldest round when full.
RoundStatus &slot_for(Oid database) {
  RoundStatus *free_slot = nullptr;
  RoundStatus *oldest = &shared->databases[0];
  for (RoundStatus &slot : shared->databases) {
    if (slot.database == database)
      return slot;
    if (slot.database == InvalidOid && free_slot == nullptr)
      free_slot = &slot;
    if (slot.last_finished < oldest->last_finished)
      oldest = &slot;
  }
  RoundStatus &slot = free_slot != nullptr ? *free_slot : *oldest;
  memset(&slot, 0, sizeof(slot));
  slot.database = database;
  return slot;
}

// Outside the spinlock: clipping calls into the encoding routines.
int clipped_length(const char *text) {
  return text != nullptr ? pg_mbcliplen(text, strlen(text), max_error_bytes - 1)
                         : 0;
}

void copy_clipped(char *field, const char *text, int length) {
  if (length > 0)
    memcpy(field, text, length);
  field[length] = '\0';
}

void finish(RoundStatus &slot, TimestampTz at, int64 deleted, const char *error,
            int error_length, bool skipped = false, int64 kept = 0,
            const char *kept_reason = nullptr, int reason_length = 0) {
  slot.last_kept = kept;
  copy_clipped(slot.last_kept_reason, kept_reason, reason_length);
  if (skipped)
    slot.skipped_rounds++;
  slot.running = false;
  slot.last_started = slot.running_since;
  slot.last_finished = at;
  slot.last_deleted = deleted;
  slot.last_failed = error != nullptr;
  copy_clipped(slot.last_error, error, error_length);
  slot.rounds++;
  slot.total_deleted += deleted;
  if (error != nullptr && !skipped)
    slot.failed_rounds++;
}

template <typename Forgotten> void forget_if(Forgotten forgotten) {
  if (shared == nullptr)
    return;
  SpinLockAcquire(&shared->mutex);
  for (RoundStatus &slot : shared->databases)
    if (forgotten(slot.database))
      memset(&slot, 0, sizeof(slot));
  SpinLockRelease(&shared->mutex);
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
  RoundStatus &slot = slot_for(database);
  slot.running = true;
  slot.running_since = at;
  SpinLockRelease(&shared->mutex);
}

void round_finished(Oid database, int64 deleted, const char *error,
                    bool skipped, int64 kept, const char *kept_reason) {
  if (shared == nullptr)
    return;
  TimestampTz at = GetCurrentTimestamp();
  int error_length = clipped_length(error);
  int reason_length = clipped_length(kept_reason);
  SpinLockAcquire(&shared->mutex);
  finish(slot_for(database), at, deleted, error, error_length, skipped, kept,
         kept_reason, reason_length);
  SpinLockRelease(&shared->mutex);
}

void round_abandoned(Oid database, const char *error) {
  if (shared == nullptr)
    return;
  TimestampTz at = GetCurrentTimestamp();
  int error_length = clipped_length(error);
  SpinLockAcquire(&shared->mutex);
  for (RoundStatus &slot : shared->databases)
    if (slot.database == database && slot.running)
      finish(slot, at, 0, error, error_length);
  SpinLockRelease(&shared->mutex);
}

void forget(Oid database) {
  forget_if([database](Oid slot) { return slot == database; });
}

void forget_all_but(const List *databases) {
  forget_if(
      [databases](Oid slot) { return !list_member_oid(databases, slot); });
}

int copy_status(RoundStatus *out) {
  if (shared == nullptr)
    return -1;
  SpinLockAcquire(&shared->mutex);
  memcpy(out, shared->databases, sizeof(RoundStatus) * max_databases);
  SpinLockRelease(&shared->mutex);
  int count = 0;
  for (int i = 0; i < max_databases; i++)
    if (out[i].database != InvalidOid)
      out[count++] = out[i];
  return count;
}

} // namespace idempotency::worker::status
