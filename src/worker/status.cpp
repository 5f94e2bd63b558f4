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

// Callers hold the mutex. The oldest round's slot is reused when full;
// nullptr when `database` has none and !create.
RoundStatus *slot_for(Oid database, bool create = true) {
  RoundStatus *free_slot = nullptr;
  RoundStatus *oldest = &shared->databases[0];
  for (RoundStatus &slot : shared->databases) {
    if (slot.database == database)
      return &slot;
    if (slot.database == InvalidOid && free_slot == nullptr)
      free_slot = &slot;
    if (slot.last_finished < oldest->last_finished)
      oldest = &slot;
  }
  if (!create)
    return nullptr;
  RoundStatus *slot = free_slot != nullptr ? free_slot : oldest;
  memset(slot, 0, sizeof(*slot));
  slot->database = database;
  return slot;
}

// Outside the spinlock: clipping calls into the encoding routines.
void clip(char (&field)[max_error_bytes], const char *text) {
  text = text != nullptr ? text : "";
  strlcpy(field, text,
          pg_mbcliplen(text, strlen(text), max_error_bytes - 1) + 1);
}

// abandoned: only a round still running, as a failure.
void end_round(Oid database, bool abandoned, int64 deleted, const char *error,
               bool skipped, int64 kept, const char *kept_reason) {
  if (shared == nullptr)
    return;
  TimestampTz at = GetCurrentTimestamp();
  char error_text[max_error_bytes] = {}; // copied whole into shared memory
  char reason_text[max_error_bytes] = {};
  clip(error_text, error);
  clip(reason_text, kept_reason);
  SpinLockAcquire(&shared->mutex);
  RoundStatus *slot = slot_for(database, !abandoned);
  if (slot != nullptr && (slot->running || !abandoned)) {
    slot->last_kept = kept;
    memcpy(slot->last_kept_reason, reason_text, max_error_bytes);
    if (skipped)
      slot->skipped_rounds++;
    slot->running = false;
    slot->last_started = slot->running_since;
    slot->last_finished = at;
    slot->last_deleted = deleted;
    slot->last_failed = error != nullptr;
    memcpy(slot->last_error, error_text, max_error_bytes);
    slot->rounds++;
    slot->total_deleted += deleted;
    if (error != nullptr && !skipped)
      slot->failed_rounds++;
  }
  SpinLockRelease(&shared->mutex);
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
  RoundStatus *slot = slot_for(database);
  slot->running = true;
  slot->running_since = at;
  SpinLockRelease(&shared->mutex);
}

void round_finished(Oid database, int64 deleted, const char *error,
                    bool skipped, int64 kept, const char *kept_reason) {
  end_round(database, false, deleted, error, skipped, kept, kept_reason);
}

void round_abandoned(Oid database, const char *error) {
  end_round(database, true, 0, error, false, 0, nullptr);
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
