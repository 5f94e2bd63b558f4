#include <climits>

#include "idempotency/worker/expire.hpp"

#include "idempotency/settings/settings.hpp"
#include "idempotency/stats/stats.hpp"
#include "idempotency/storage/key_store.hpp"

#include "idempotency/compat.hpp"

extern "C" {
#include "access/xact.h"
#include "commands/extension.h"
#include "utils/backend_status.h"
#include "utils/memutils.h"
}

namespace idempotency::worker {

bool extension_installed() {
  return OidIsValid(get_extension_oid("idempotency", true));
}

// A key's created_at is the clock when its row was written and its
// expires_at counts from there, so a key's lifetime starts after its
// transaction did; callers still compare expires_at with their own
// transaction's start. The cutoff therefore still works: it is at or before
// the start of every transaction that may call, so a key with expires_at at
// or before it is expired for all of them and for every later one. A key's
// row is invisible to expiry until its transaction commits, and a
// transaction cannot commit a key that has already expired
// (storage/commit_guard.hpp) - except through COMMIT PREPARED, and then the
// key is deleted like any other expired key.
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

ExpiryBatch expire_batch(const storage::KeyStore &store,
                         storage::ExpiryRound &round, int batch_size) {
  storage::ExpiryBatch batch = store.expire_batch(round, batch_size);
  stats::count_expired(batch.deleted);
  return batch;
}

storage::ExpiryRound begin_expiry(TimestampTz cutoff, MemoryContext context) {
  return storage::ExpiryRound{cutoff, context, nullptr, false, false, true};
}

// The cutoff is the transaction's start, the instant idempotent_call
// compares expires_at with. Each pass is deleted at once.
int64 expire_now() {
  PreventCommandDuringRecovery("idempotency.expire()");
  PreventCommandIfReadOnly("idempotency.expire()");
  PreventCommandIfParallelMode("idempotency.expire()");

  TimestampTz cutoff = expiry_cutoff(GetCurrentTransactionStartTimestamp());
  int batch_size = settings::expire_batch_size();
  int64 deleted = 0;
  for (int i = 0; i < storage::key_backend_count; i++) {
    storage::KeyStore store = storage::expiry_store(i);
    MemoryContext context =
        AllocSetContextCreate(CurrentMemoryContext, "idempotency expiry pass",
                              ALLOCSET_DEFAULT_SIZES);
    storage::ExpiryRound round = begin_expiry(cutoff, context);
    do {
      store.collect_expired(round, batch_size);
      while (round.has_batch)
        deleted += expire_batch(store, round, INT_MAX).deleted;
    } while (!round.finished);
    MemoryContextDelete(context);
  }
  return deleted;
}

} // namespace idempotency::worker
