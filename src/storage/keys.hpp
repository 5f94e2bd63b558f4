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

#include "pg.hpp"
#include "storage/citus.hpp"

namespace idempotency::storage {

// The key table of a call: idempotency.keys of the current database, or
// idempotency.tenant_keys, the key table Citus distributes with the tenants'
// data (storage/tenant_keys.hpp). Looked up once per call.
struct KeyTable {
  Oid relid;
  // Tenant keys only (InvalidOid otherwise): the tenant's shard of the
  // table on this node, and the table's owner, who reads and writes it.
  Oid local_shard;
  Oid owner;

  bool tenant() const { return OidIsValid(local_shard); }
};
static_assert(std::is_trivially_destructible_v<KeyTable>);

// Raises 42P01 when the table is missing, and 0A000 when Citus has taken it
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

// A key in its scope (the role that calls), with the key's digest
// (fingerprint/key_digest.hpp), which the primary key holds: the ordered
// digest in idempotency.keys, the unordered one for tenant keys. Keys of
// idempotency.tenant_keys also belong to a tenant: a value of the type of
// the business tables' distribution column (has_tenant).
struct KeyRef {
  Oid scope;
  text *key;
  bytea *digest;
  // The digest of versions 0.4 and 0.5, where it is another
  // (fingerprint::legacy_digest_of_key), else nullptr.
  bytea *legacy_digest;
  // The unordered digest of versions 0.4 to 0.6 in idempotency.keys, where
  // it is another (fingerprint::digest_of_key), else nullptr.
  bytea *unordered_digest;
  bool has_tenant;
  Oid tenant_type;
  Datum tenant;
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
  bytea *request_hash;  // done: the stored fingerprint
  bool request_hash_is_hex; // as text, in a table of a version before 0.4
  Datum response;           // done: the stored response
  bool response_is_null;
  TimestampTz created_at; // done, expired: the row's times
  TimestampTz expires_at;
};
static_assert(std::is_trivially_destructible_v<KeyProbe>);

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
// row is written, expires_at = created_at + ttl, never later than created_at
// + idempotency.max_ttl (settings::key_expiry). The primary key's unique
// check is the final word: a second row for one key can never commit. The
// transaction's commit is refused if a key it wrote has expired by then
// (see storage/commit_guard.hpp).
StoredRow store(const KeyTable &table, const KeyRef &key, bytea *request_hash,
                Datum response, bool response_is_null, const Interval &ttl,
                const ItemPointerData *expired_row);

// Deletes a done row of a key whose owner forgets it (`stored`, as probe()
// found it). Returns false when the row was deleted meanwhile (by expiry); a
// row being changed by another open transaction is waited for.
bool remove(const KeyTable &table, const KeyRef &key, const KeyProbe &stored);

// The key table of `key`: key_table(), or tenant_keys::table_for(key).
KeyTable table_for(const KeyRef &key);

// Whether a stored row shows its key as in progress to other transactions
// before it commits. In idempotency.keys it does (probe reads the index with
// a dirty snapshot), so a call lets go of its claim once the row is written.
// A tenant key is read through Citus with an MVCC snapshot: the claim must
// cover the key until the transaction ends.
bool row_shows_in_progress(const KeyTable &table);

// 23505: a stored row has the key's scope and digest but another key text.
pg_attribute_noreturn() void report_shared_digest();

} // namespace idempotency::storage
