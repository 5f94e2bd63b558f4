// Key storage: the table idempotency.keys and its primary key index.
//
// Reads go straight to the index with a dirty snapshot, which also sees rows
// of transactions still in progress: that is how a call learns that another
// transaction holds a key, and which transaction to wait for. Writes go
// straight to the heap and its indexes too: callers have no write access to
// the table, and a fixed-shape row needs no executor (no triggers, no
// constraint expressions to evaluate, no plan).
#pragma once

#include "pg.hpp"

namespace idempotency::storage {

// Column numbers of idempotency.keys, as the install script creates it.
namespace column {
constexpr AttrNumber scope = 1;
constexpr AttrNumber key = 2;
constexpr AttrNumber request_hash = 3;
constexpr AttrNumber status = 4;
constexpr AttrNumber response = 5;
constexpr AttrNumber created_at = 6;
constexpr AttrNumber expires_at = 7;
constexpr int count = 7;
} // namespace column

// idempotency.keys of the current database, looked up once per call.
struct KeyTable {
  Oid relid;
};
static_assert(std::is_trivially_destructible_v<KeyTable>);

KeyTable key_table();

// A key in its scope (the role that calls).
struct KeyRef {
  Oid scope;
  text *key;
};
static_assert(std::is_trivially_destructible_v<KeyRef>);

enum class KeyState {
  absent,      // no row, or only rows of rolled-back transactions
  expired,     // a committed row past its TTL: absent for callers
  in_progress, // a row written or being replaced by an open transaction
  done,        // a committed (or our own) row within its TTL
};

struct KeyProbe {
  KeyState state;
  TransactionId holder; // in_progress: the transaction to wait for
  ItemPointerData row;  // expired: the row a new call replaces; done: the row
  text *request_hash;   // done: the stored fingerprint
  Datum response;       // done: the stored response
  bool response_is_null;
  TimestampTz created_at; // done, expired: the row's times
  TimestampTz expires_at;
};
static_assert(std::is_trivially_destructible_v<KeyProbe>);

// Looks the key up. Under REPEATABLE READ or SERIALIZABLE, a row committed
// by another transaction after this transaction's snapshot raises 40001.
// Values are copied into the current memory context.
KeyProbe probe(const KeyTable &table, const KeyRef &key, TimestampTz now);

// Stores a completed call: inserts the row, after deleting the expired row
// it replaces (`expired_row`, or nullptr). The primary key's unique check
// is the final word: a second row for one key can never commit.
//
// Callers go through protocol::store_outcome(), which fixes the key's times.
void store(const KeyTable &table, const KeyRef &key, text *request_hash,
           Datum response, bool response_is_null, TimestampTz created_at,
           TimestampTz expires_at, const ItemPointerData *expired_row);

// Deletes a done row of a key whose owner forgets it. Returns false when the
// row was deleted meanwhile (by expiry); a row being changed by another open
// transaction is waited for.
bool remove(const KeyTable &table, const ItemPointerData &row);

} // namespace idempotency::storage
