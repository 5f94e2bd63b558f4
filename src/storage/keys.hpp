// Key storage: the table idempotency.keys and its primary key index.
//
// Reads go straight to the index with a dirty snapshot, which also sees rows
// of transactions still in progress: that is how a call learns that another
// transaction holds a key, and which transaction to wait for. Writes go
// through PostgreSQL's executor as a single-row INSERT does (the way logical
// replication applies a row): defaults of columns a DBA added, constraints,
// row triggers, every kind of index and exclusion constraints are honoured,
// and indexes still being built concurrently are skipped until ready.
#pragma once

#include "pg.hpp"

namespace idempotency::storage {

// idempotency.keys of the current database, looked up once per call.
struct KeyTable {
  Oid relid;
};

KeyTable key_table();

// Where the extension's columns are in idempotency.keys, found by name. A
// DBA may add and drop other columns; ours must keep their names and types.
struct KeyColumns {
  AttrNumber scope;
  AttrNumber key;
  AttrNumber request_hash;
  AttrNumber response;
  AttrNumber created_at;
  AttrNumber expires_at;
};

// The columns of `rel` (idempotency.keys, opened by the caller). Raises
// 42703 when one of the extension's columns is missing and 42804 when its
// type was changed. Cached per backend until the table's definition changes.
const KeyColumns &key_columns(Relation rel);

// A key in its scope (the role that calls).
struct KeyRef {
  Oid scope;
  text *key;
};

enum class KeyState {
  absent,      // no row, or only rows of rolled-back transactions
  expired,     // a committed row past its TTL: absent for callers
  in_progress, // a row written or being replaced by an open transaction
  done,        // a committed (or our own) row within its TTL
};

struct KeyProbe {
  KeyState state;
  TransactionId holder; // in_progress: the transaction to wait for
  ItemPointerData row;  // expired: the row a new call replaces
  text *request_hash;   // done: the stored fingerprint
  Datum response;       // done: the stored response
  bool response_is_null;
};

// Looks the key up. Under REPEATABLE READ or SERIALIZABLE, a row committed
// by another transaction after this transaction's snapshot raises 40001.
// Values are copied into the current memory context.
KeyProbe probe(const KeyTable &table, const KeyRef &key, TimestampTz now);

// What a stored row says about its lifetime, as written (a BEFORE trigger
// may have changed either value).
struct StoredRow {
  TimestampTz created_at;
  TimestampTz expires_at;
};

// Stores a completed call: inserts the row, after deleting the expired row
// it replaces (`expired_row`, or nullptr). created_at is the clock when the
// row is written, expires_at = created_at + ttl. The primary key's unique
// check is the final word: a second row for one key can never commit. The
// transaction's commit is refused if a key it wrote has expired by then
// (see storage/commit_guard.hpp).
StoredRow store(const KeyTable &table, const KeyRef &key, text *request_hash,
                Datum response, bool response_is_null, const Interval &ttl,
                const ItemPointerData *expired_row);

} // namespace idempotency::storage
