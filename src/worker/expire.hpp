// Deleting expired keys: the part of a round that runs in transactions,
// shared by the background worker and idempotency.expire().
//
// A round walks the index on expires_at up to a cutoff in passes. A pass
// collects the expired keys' row addresses with one read-only scan; the
// rows are then deleted in heap order, in batches. The worker commits each
// batch on its own (so no transaction holds many rows for long);
// idempotency.expire() runs them all in the caller's transaction. Nothing
// waits for callers: a key whose claim a caller holds, or whose row another
// transaction has locked or changed, is skipped and left for a later round.
#pragma once

#include "pg.hpp"

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

struct ExpiredKeys {
  ItemPointerData *tids; // sorted in heap order
  int count;
  bool finished; // no expired key left after the cursor
};

// Whether the extension is installed in this database (needs a transaction).
bool extension_installed();

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
// the rows `tids` that are still expired and that nobody holds; returns how
// many it deleted.
int64 delete_expired(TimestampTz cutoff, const ItemPointerData *tids,
                     int count);

} // namespace idempotency::worker
