// Key storage: the table idempotency.keys and its primary key index.
//
// The primary key is (scope, key_digest): the role and a fixed-size digest
// of the key (fingerprint::key_digest), so its entries stay small however
// long keys are. The key's text is kept in the row and compared on every
// lookup. Reads go straight to the index with a dirty snapshot, which also sees
// rows of transactions still in progress: that is how a call learns that
// another transaction holds a key, and which transaction to wait for. Writes go
// through PostgreSQL's executor as a single-row INSERT does (the way logical
// replication applies a row): defaults of columns a DBA added, constraints,
// row triggers, every kind of index and exclusion constraints are honoured,
// and indexes still being built concurrently are skipped until ready.
#pragma once

#include "idempotency/pg.hpp"
#include "idempotency/storage/citus.hpp"
#include "idempotency/storage/key_store.hpp"

extern "C" {
#include "storage/lockdefs.h"
#include "utils/relcache.h"
}

namespace idempotency::storage {

// idempotency.keys of the current database, as a call's key table. Raises
// 42P01 when the table is missing, and 0A000 when Citus has taken it
// over (a distributed, reference or Citus-managed local table: its rows are
// then in shards, not in the local heap read and written here; see
// storage/citus.hpp). Both answers are cached until the table's relcache
// entry is invalidated, so the check costs a call nothing.
KeyTable key_table();

// Whether (and how) Citus has taken idempotency.keys over, without raising:
// for the expiry worker, which then leaves the database alone. not_citus
// when the table does not exist.
citus::TableKind key_table_citus_kind();

// Where the extension's columns are in idempotency.keys, found by name. A
// DBA may add and drop other columns; ours must keep their names and types.
struct KeyColumns {
  AttrNumber scope;
  AttrNumber key;
  AttrNumber key_digest;
  AttrNumber request_hash;
  AttrNumber response;
  AttrNumber created_at;
  AttrNumber expires_at;
  // The row of versions before 0.4, until ALTER EXTENSION UPDATE: no
  // key_digest (the primary key is on the key's text) and request_hash as
  // hex text.
  bool text_layout;
  // Versions 0.4 and 0.5 in a database whose encoding is neither UTF8 nor
  // SQL_ASCII, until ALTER EXTENSION UPDATE: key_digest holds the digest of
  // the key's bytes in that encoding (fingerprint::legacy_digest_of_key),
  // not of its UTF-8 form.
  bool legacy_digest;
  // Versions 0.4 to 0.6, until ALTER EXTENSION UPDATE: key_digest holds
  // every key's unordered digest (fingerprint::unordered_digest_of_key),
  // not the ordered one that KeyRef::digest is.
  bool unordered_digest;
};

// The columns of `rel` (idempotency.keys, opened by the caller). Raises
// 42703 when one of the extension's columns is missing and 42804 when its
// type was changed. Cached per backend until the table's definition changes.
// Raises 0A000, as key_table() does, when Citus has taken the table over:
// checked again here, with the table locked.
const KeyColumns &key_columns(Relation rel);

// idempotency.keys as a KeyBackend (storage/key_store.hpp):
// - probe reads the primary key index with a dirty snapshot, so it also
//   sees rows of transactions still in progress (in_progress, and the
//   transaction to wait for);
// - store inserts the row through the executor (after deleting the expired
//   row it replaces); the transaction's commit is refused if a key it wrote
//   has expired by then (storage/commit_guard.hpp);
// - remove deletes the row probe found, waiting for a transaction changing
//   it;
// - expiry walks the index keys_expires_at_idx (expires_at
//   idempotency.expiry_ops) up to the cutoff in passes: a pass collects the
//   expired keys' row addresses with one read-only scan, and the rows are
//   then deleted in heap order, a batch at a time. Expiry takes no claim and
//   waits for no one: a row another transaction has locked or changed is
//   skipped and left for a later round. A caller that sees a key expired
//   runs fn at once; its write of the new row waits only for an expiry
//   transaction that deleted the old row and has not yet ended.
class LocalKeys final : public KeyBackend {
public:
  KeyProbe probe(const KeyTable &table, const KeyRef &key,
                 TimestampTz now) const override;
  StoredRow store(const KeyTable &table, const KeyRef &key,
                  const NewRow &row) const override;
  bool remove(const KeyTable &table, const KeyRef &key,
              const KeyProbe &stored) const override;
  bool row_shows_in_progress() const override { return true; }
  void collect_expired(ExpiryRound &round, int batch_size) const override;
  ExpiryBatch expire_batch(ExpiryRound &round, int batch_size) const override;
};

extern const LocalKeys local_keys;

// Locks idempotency.keys in `mode` until the end of the transaction. False
// when the table is gone: DROP EXTENSION may commit between two of an
// expiry round's transactions.
bool lock_key_table(LOCKMODE mode);

} // namespace idempotency::storage
