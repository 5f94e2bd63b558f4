// The key store: the one way the protocol, the expiry worker and the role
// marks reach a key table, idempotency.keys (storage/keys.hpp) or, for a
// tenant key, idempotency.tenant_keys (storage/tenant_keys.hpp), through
// KeyStore; the protocol never asks which one it has.
#pragma once

#include "idempotency/pg.hpp"
#include "idempotency/storage/role_marks.hpp"

extern "C" {
#include "access/tupdesc.h"
#include "datatype/timestamp.h"
#include "storage/itemptr.h"
}

namespace idempotency::storage {

// A key in its scope (the role that calls), with the digest the primary key
// holds; a tenant key (has_tenant) also has a value of the type of the
// business tables' distribution column.
struct KeyRef {
  Oid scope;
  text *key;
  bytea *digest;
  bool has_tenant;
  Oid tenant_type;
  Datum tenant;
};
static_assert(std::is_trivially_destructible_v<KeyRef>);

enum class KeyState {
  absent,      // no row, or only rows of rolled-back transactions
  expired,     // a committed row past its TTL and, if it has a tombstone
               // window (idempotency.remember), past that: absent for callers
  gone,        // a tombstone, or a row past its TTL expiry has not yet turned
               // into one, in its window. A retry of its request gets IK410.
  in_progress, // a row written or being replaced by an open transaction
  done,        // a committed (or our own) row within its TTL
};

struct KeyProbe {
  KeyState state;
  TransactionId holder; // in_progress: the transaction to wait for
  // The row version (expired: the one a new call replaces; done, gone: the
  // row). The address alone names no row for long: once the row is
  // deleted, vacuum may give its slot to another key's row.
  ItemPointerData tid;
  TransactionId xmin;  // as written, kept when the row is frozen
  bytea *request_hash; // done, gone: the stored fingerprint
  Datum response;      // done: the stored response
  bool response_is_null;
  TimestampTz created_at; // done, expired, gone: the row's times; gone:
  TimestampTz expires_at; // expires_at is when the key is forgotten
  TimestampTz response_expired_at; // gone: when its response expired
};
static_assert(std::is_trivially_destructible_v<KeyProbe>);

// As written: a BEFORE trigger may change them.
struct StoredRow {
  TimestampTz created_at;
  TimestampTz expires_at;
};

// For KeyStore::store(); ttl and remember as in force when the key was claimed.
struct NewRow {
  bytea *request_hash;
  Datum response;
  bool response_is_null;
  Interval ttl;
  Interval remember;
  const KeyProbe *replaces; // the expired row probe() found, or nullptr
  TimestampTz judged_at;    // probe's `now`
};
static_assert(std::is_trivially_destructible_v<NewRow>);

// Carried across the transactions an expiry round runs in.
struct ExpiryRound {
  TimestampTz cutoff;    // keys expiring at or before it are expired for all
  MemoryContext context; // lives for the round; the store keeps its work here
  void *progress;        // the store's own; nullptr before its first pass
  bool has_batch;        // keys collected and not yet deleted
  bool finished;         // no expired key left to collect
  // Whether idempotency.expire_rate paces batches (not one statement by Citus).
  bool paced;
  // Expired rows kept because writing their tombstone failed, and the first
  // such error, "SQLSTATE: message" in `context`.
  int64 kept;
  const char *kept_reason;
};
static_assert(std::is_trivially_destructible_v<ExpiryRound>);

struct ExpiryBatch {
  int64 deleted;
  int64 handled; // deleted or skipped: what idempotency.expire_rate counts
};

struct KeyTable {
  Oid relid;
  // Tenant keys only: the tenant's shard on this node and the table's owner.
  Oid local_shard;
  Oid owner;
};
static_assert(std::is_trivially_destructible_v<KeyTable>);

// In the order expiry, the role marks and DROP OWNED visit them.
enum class KeyTableKind { local, tenant };
constexpr KeyTableKind key_table_kinds[] = {KeyTableKind::local,
                                            KeyTableKind::tenant};

class KeyStore {
public:
  KeyStore(KeyTableKind kind, KeyTable table) : kind_(kind), table_(table) {}

  // Looks the key up. Under REPEATABLE READ or SERIALIZABLE, a row committed
  // by another transaction after this transaction's snapshot raises 40001.
  // Values are copied into the current memory context.
  KeyProbe probe(const KeyRef &key, TimestampTz now) const;
  // Stores a completed call's row, after deleting the expired row version
  // it replaces (never whatever row holds its address by now).
  StoredRow store(const KeyRef &key, const NewRow &row) const;
  // Deletes the done or gone row version `stored` of a key its owner
  // forgets; false when expiry deleted it meanwhile.
  bool remove(const KeyRef &key, const KeyProbe &stored) const;
  // Whether an uncommitted row shows its key as in progress to others (the
  // local table's dirty-snapshot probe sees it; a tenant key's MVCC read
  // does not); if not, the call's claim covers it until the transaction ends.
  bool row_shows_in_progress() const { return kind_ == KeyTableKind::local; }

  // This kind's key table where it holds keys on this node, or InvalidOid.
  Oid relation() const;
  // For the role marks and DROP OWNED, on `relid` (relation(), locked): the
  // roles with keys on this node; one role's keys deleted, snapshot now.
  role_keys::Roles roles_with_keys(Oid relid, AttrNumber scope_column) const;
  uint64 delete_keys_of(Oid relid, AttrNumber scope_column, Oid role) const;

  // Expiry, in steps the caller runs in transactions of its own, each with
  // an active snapshot: collect the next expired keys (read-only), then
  // delete them a batch at a time while round.has_batch.
  void collect_expired(ExpiryRound &round, int batch_size) const;
  ExpiryBatch expire_batch(ExpiryRound &round, int batch_size) const;

private:
  KeyTableKind kind_;
  KeyTable table_;
};
static_assert(std::is_trivially_destructible_v<KeyStore>);

// The store of `key`; raises as key_table() or tenant_keys::table_for() do.
KeyStore key_store_for(const KeyRef &key);

// For expiry and the role marks, which find the table in each of their
// transactions: DROP EXTENSION may commit between two.
KeyStore store_of_kind(KeyTableKind kind);

// 23505: a stored row has the key's scope and digest but another key text.
[[noreturn]] void report_shared_digest();

// What the BEFORE INSERT row triggers did with a key's row.
enum class TriggeredRow {
  kept,    // written as they left it (changed or not)
  skipped, // a trigger returned NULL: no row
  moved,   // a trigger changed one of the `fixed` columns
};

// Raises 09000 unless `result` is kept. An empty `key` is a tombstone's,
// written by expiry: its message names no key.
void check_key_row_kept(TriggeredRow result, const char *table,
                        const char *fixed_columns, const text *key);

// Found by name: the extension is not relocatable.
namespace schema {

// InvalidOid when the schema does not exist and `missing_ok`, else 3F000.
Oid oid(bool missing_ok);

// InvalidOid when the relation or the schema does not exist.
Oid relation(const char *name);

} // namespace schema

// The live column `name` of `desc`, or nullptr: columns are found by name,
// since a DBA may add, drop and reorder others.
Form_pg_attribute find_column(TupleDesc desc, const char *name);

// Whether a column of `type` can hold a key's scope, a role's oid: regrole,
// or the extension's own 4-byte by-value type for it.
bool fits_scope(Oid type);

} // namespace idempotency::storage
