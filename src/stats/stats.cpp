#include "idempotency/stats/stats.hpp"

extern "C" {
#include "miscadmin.h"
#include "storage/lwlock.h"
#include "storage/shmem.h"
#include "storage/spin.h"
#include "utils/syscache.h"
#include "utils/timestamp.h"
}

namespace idempotency::stats {

namespace {

constexpr int event_kinds = 5;

struct DatabaseCounters {
  Oid database; // InvalidOid: free slot; written under SharedStats::mutex
  pg_atomic_uint64 events[event_kinds];
  pg_atomic_uint64 expired;
  pg_atomic_uint64 reset_at; // TimestampTz of the last reset
};

struct SharedStats {
  slock_t mutex;
  DatabaseCounters databases[max_counted_databases];
};

SharedStats *shared = nullptr;
// Found once: a backend serves one database for its whole life.
DatabaseCounters *own = nullptr;

void init_counters(DatabaseCounters &slot, Oid database) {
  for (auto &event : slot.events)
    pg_atomic_init_u64(&event, 0);
  pg_atomic_init_u64(&slot.expired, 0);
  pg_atomic_init_u64(&slot.reset_at, (uint64)GetCurrentTimestamp());
  slot.database = database;
}

// nullptr when every slot belongs to a live database. The catalog lookups
// may raise an error, so they run outside the spinlock; under it a slot is
// taken only if its owner is still the one looked up.
DatabaseCounters *slot_of(Oid database) {
  for (;;) {
    Oid seen_owner[max_counted_databases];
    SpinLockAcquire(&shared->mutex);
    for (int i = 0; i < max_counted_databases; i++)
      seen_owner[i] = shared->databases[i].database;
    SpinLockRelease(&shared->mutex);
    bool reusable[max_counted_databases];
    bool any_reusable = false;
    for (int i = 0; i < max_counted_databases; i++) {
      reusable[i] = seen_owner[i] == InvalidOid ||
                    (seen_owner[i] != database &&
                     !SearchSysCacheExists1(DATABASEOID,
                                            ObjectIdGetDatum(seen_owner[i])));
      any_reusable |= reusable[i];
    }
    SpinLockAcquire(&shared->mutex);
    DatabaseCounters *found = nullptr;
    for (auto &slot : shared->databases)
      if (slot.database == database)
        found = &slot;
    for (int i = 0; found == nullptr && i < max_counted_databases; i++)
      if (reusable[i] && shared->databases[i].database == seen_owner[i]) {
        found = &shared->databases[i];
        init_counters(*found, database);
      }
    SpinLockRelease(&shared->mutex);
    if (found != nullptr || !any_reusable)
      return found;
  }
}

DatabaseCounters *own_slot() {
  if (shared == nullptr || !OidIsValid(MyDatabaseId))
    return nullptr;
  if (own == nullptr)
    own = slot_of(MyDatabaseId);
  return own;
}

} // namespace

void request_shared_memory() { RequestAddinShmemSpace(sizeof(SharedStats)); }

void attach_shared_memory() {
  bool found;
  LWLockAcquire(AddinShmemInitLock, LW_EXCLUSIVE);
  shared = static_cast<SharedStats *>(
      ShmemInitStruct("idempotency stats", sizeof(SharedStats), &found));
  if (!found) {
    SpinLockInit(&shared->mutex);
    for (auto &slot : shared->databases)
      init_counters(slot, InvalidOid);
  }
  LWLockRelease(AddinShmemInitLock);
}

void count(Event event) {
  if (DatabaseCounters *slot = own_slot())
    pg_atomic_fetch_add_u64(&slot->events[static_cast<int>(event)], 1);
}

void count_expired(int64 keys) {
  if (DatabaseCounters *slot = own_slot())
    pg_atomic_fetch_add_u64(&slot->expired, keys);
}

// This database always has a row when the counters exist.
int copy_counters(Datum (*out)[counter_columns]) {
  if (shared == nullptr)
    return 0;
  own_slot();
  int count = 0;
  for (auto &slot : shared->databases) {
    auto read = [](pg_atomic_uint64 &counter) {
      return Int64GetDatum(static_cast<int64>(pg_atomic_read_u64(&counter)));
    };
    auto event = [&](Event kind) {
      return read(slot.events[static_cast<int>(kind)]);
    };
    if (OidIsValid(slot.database)) {
      Datum row[] = {ObjectIdGetDatum(slot.database),
                     event(Event::ran),
                     event(Event::replayed),
                     event(Event::conflict),
                     event(Event::mismatch),
                     read(slot.expired),
                     read(slot.reset_at),
                     event(Event::late_retry)};
      memcpy(out[count++], row, sizeof row);
    }
  }
  return count;
}

void reset() {
  if (DatabaseCounters *slot = own_slot()) {
    for (auto &event : slot->events)
      pg_atomic_write_u64(&event, 0);
    pg_atomic_write_u64(&slot->expired, 0);
    pg_atomic_write_u64(&slot->reset_at, (uint64)GetCurrentTimestamp());
  }
}

} // namespace idempotency::stats
