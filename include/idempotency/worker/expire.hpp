// Expiry rounds: what the background worker (worker/database_round) and
// idempotency.expire() share. Each round visits the key stores
// (storage/key_store.hpp) in turn, collecting and deleting expired keys a
// batch at a time; the stores know their tables, the worker only paces the
// batches and runs them in transactions.
#pragma once

#include "idempotency/pg.hpp"
#include "idempotency/storage/key_store.hpp"

namespace idempotency::worker {

using storage::ExpiryBatch;

// Whether the extension is installed in this database (needs a transaction).
bool extension_installed();

// The cutoff of a round that starts at `now` in this database: keys whose
// expires_at is at or before it are expired for every transaction running in
// the database and every one that starts later. idempotent_call compares
// expires_at with its transaction's start, so a transaction that started
// before `now` keeps the keys that are still live for it.
TimestampTz expiry_cutoff(TimestampTz now);

// A round in one store, its work kept in `context` (the caller's, which it
// deletes when the round ends).
storage::ExpiryRound begin_expiry(TimestampTz cutoff, MemoryContext context);

// store.expire_batch(), its deletions counted in the statistics.
ExpiryBatch expire_batch(const storage::KeyStore &store,
                         storage::ExpiryRound &round, int batch_size);

// Reports that a round kept `kept` expired rows because their tombstones
// were refused, with the first refusal (storage::ExpiryRound::kept_reason):
// a WARNING naming the cause, never a key.
void warn_kept_rows(const char *database, int64 kept, const char *reason);

// idempotency.expire(): one round now, in the caller's transaction; returns
// how many keys it deleted.
int64 expire_now();

} // namespace idempotency::worker
