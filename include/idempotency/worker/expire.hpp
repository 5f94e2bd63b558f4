// Deleting expired keys: the part of a round that runs in transactions,
// shared by the background worker and idempotency.expire().
//
// A round walks the index on expires_at up to a cutoff in passes. A pass
// collects the expired keys' row addresses with one read-only scan; the
// rows are then deleted in heap order, in batches. The worker commits each
// batch on its own (so no transaction holds many rows for long);
// idempotency.expire() runs them all in the caller's transaction. Expiry
// takes no claim and waits for no one: a row another transaction has locked
// or changed is skipped and left for a later round. A caller that sees a key
// expired runs fn at once; its write of the new row waits only for an
// expiry transaction that deleted the old row and has not yet ended.
#pragma once

#include "idempotency/pg.hpp"

namespace idempotency::worker {

// How far a round has come in the expires_at index. A pass goes on after
// the last entry the previous one read, so no pass steps again over keys
// an earlier one handled. Keys may share their expires_at; B-tree keeps
// such equal entries in heap order, so the entry's row address orders them.
struct ExpiryCursor {
  bool positioned;
  TimestampTz expires_at;
  ItemPointerData tid;
};
static_assert(std::is_trivially_destructible_v<ExpiryCursor>);

struct ExpiredKeys {
  ItemPointerData *tids; // sorted in heap order
  int count;
  bool finished; // no expired key left after the cursor
};
static_assert(std::is_trivially_destructible_v<ExpiredKeys>);

// Whether the extension is installed in this database (needs a transaction).
bool extension_installed();

// Locks idempotency.keys in `mode` until the end of the transaction. False
// when the table is gone: DROP EXTENSION may commit between two of a
// round's transactions.
bool lock_key_table(LOCKMODE mode);

// The cutoff of a round that starts at `now` in this database: keys whose
// expires_at is at or before it are expired for every transaction running in
// the database and every one that starts later. idempotent_call compares
// expires_at with its transaction's start, so a transaction that started
// before `now` keeps the keys that are still live for it.
TimestampTz expiry_cutoff(TimestampTz now);

// How many keys one pass collects at most, for a given batch size.
int keys_per_pass(int batch_size);

// Collects up to `limit` keys with expires_at <= cutoff after the cursor,
// visible to the active snapshot, and moves the cursor on. The result is
// allocated in `result_context`.
ExpiredKeys collect_expired(TimestampTz cutoff, int limit, ExpiryCursor *cursor,
                            MemoryContext result_context);

// Deletes, in the current transaction with the active snapshot, those of
// the rows `tids` that are still expired and that no other transaction is
// changing; returns how many it deleted.
int64 delete_expired(TimestampTz cutoff, const ItemPointerData *tids,
                     int count);

// Body of idempotency.expire(): one round in the caller's transaction;
// returns how many keys it deleted.
Datum expire_body(FunctionCallInfo fcinfo);

// Deletes the expired keys of idempotency.tenant_keys (Citus), when this
// node is the Citus coordinator; counts them as expired. In a transaction.
int64 expire_tenant_keys(TimestampTz cutoff);

} // namespace idempotency::worker
