#include <climits>

#include "idempotency/worker/expire.hpp"

#include "idempotency/settings/settings.hpp"
#include "idempotency/stats/stats.hpp"
#include "idempotency/storage/key_store.hpp"

#include "idempotency/compat.hpp"

extern "C" {
#include "access/xact.h"
#include "commands/dbcommands.h"
#include "commands/extension.h"
#include "miscadmin.h"
#include "utils/backend_status.h"
#include "utils/lsyscache.h"
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
  return storage::ExpiryRound{cutoff, context, nullptr, false,
                              false,  true,    0,       nullptr};
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

// The cutoff is the transaction's start, the instant idempotent_call
// compares expires_at with. Each pass is deleted at once.
int64 expire_now() {
  PreventCommandDuringRecovery("idempotency.expire()");
  PreventCommandIfReadOnly("idempotency.expire()");
  PreventCommandIfParallelMode("idempotency.expire()");

  TimestampTz cutoff = expiry_cutoff(GetCurrentTransactionStartTimestamp());
  int batch_size = settings::expire_batch_size();
  int64 deleted = 0;
  int64 kept = 0;
  const char *kept_reason = nullptr;
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
    if (round.kept > 0 && kept_reason == nullptr)
      kept_reason = pstrdup(round.kept_reason);
    kept += round.kept;
    MemoryContextDelete(context);
  }
  if (kept > 0)
    warn_kept_rows(get_database_name(MyDatabaseId), kept, kept_reason);
  return deleted;
}

} // namespace idempotency::worker
