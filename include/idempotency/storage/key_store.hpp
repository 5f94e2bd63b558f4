// The key store: the one way the protocol, the expiry worker and the role
// marks reach a key table.
//
// A call chooses its store once, from its key (key_store_for): the local
// table idempotency.keys (storage/keys.hpp), or, for a tenant key,
// idempotency.tenant_keys, which Citus distributes with the business tables
// (storage/tenant_keys.hpp). Both offer the same operations - probe, store,
// remove, and expiry a batch at a time - behind KeyBackend; the protocol
// never asks which one it has.
//
// Here too: the extension's schema, its relations and their columns, found
// by name, as every table the library reads or writes is.
#pragma once

#include "idempotency/pg.hpp"
#include "idempotency/storage/role_marks.hpp"

extern "C" {
#include "access/tupdesc.h"
#include "datatype/timestamp.h"
#include "storage/itemptr.h"
}

namespace idempotency::storage {

// A key in its scope (the role that calls), with the key's digest
// (fingerprint/key_digest.hpp), which the primary key holds: the ordered
// digest in idempotency.keys, the tenant digest for tenant keys. Keys of
// idempotency.tenant_keys also belong to a tenant: a value of the type of
// the business tables' distribution column (has_tenant).
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
  gone,        // a row whose response expired, within its tombstone window:
               // a tombstone, or a row past its TTL expiry has not yet
               // turned into one. A retry of its request gets IK410.
  in_progress, // a row written or being replaced by an open transaction
  done,        // a committed (or our own) row within its TTL
};

// One version of a stored row: its address and the transaction that wrote
// it. The address alone names no row for long: once expiry has deleted the
// row, vacuum may give its slot to another key's row.
struct RowVersion {
  ItemPointerData tid;
  TransactionId xmin; // as written, kept when the row is frozen
};

struct KeyProbe {
  KeyState state;
  TransactionId holder; // in_progress: the transaction to wait for
  RowVersion row;       // expired: the row a new call replaces; done, gone:
                        // the row
  bytea *request_hash;  // done, gone: the stored fingerprint
  Datum response;       // done: the stored response
  bool response_is_null;
  TimestampTz created_at; // done, expired, gone: the row's times; gone:
  TimestampTz expires_at; // expires_at is when the key is forgotten
  TimestampTz response_expired_at; // gone: when its response expired
};
static_assert(std::is_trivially_destructible_v<KeyProbe>);

// What a stored row says about its lifetime, as written (a BEFORE trigger
// may have changed either value).
struct StoredRow {
  TimestampTz created_at;
  TimestampTz expires_at;
};

// A completed call's row, for KeyStore::store(). created_at is the clock
// when the row is written, expires_at = created_at + ttl, never later than
// created_at + idempotency.max_ttl (settings::key_expiry); remember_for the
// exact span `remember` gives after expires_at (settings::remember_usecs).
// Both settings are those in force when the key was claimed.
struct NewRow {
  bytea *request_hash;
  Datum response;
  bool response_is_null;
  Interval ttl;
  Interval remember;
  // The expired row the new one replaces, as probe() found it; nullptr when
  // the key had none.
  const KeyProbe *replaces;
  // The instant the call judged the key by (probe's `now`).
  TimestampTz judged_at;
};
static_assert(std::is_trivially_destructible_v<NewRow>);

// Where one round of expiry stands in a store, carried across the
// transactions the round runs in (the worker commits each batch on its own;
// idempotency.expire() runs them all in the caller's transaction).
struct ExpiryRound {
  // Keys whose expires_at is at or before it are expired for every
  // transaction (worker/expire.cpp, expiry_cutoff).
  TimestampTz cutoff;
  MemoryContext context; // lives for the round; the store keeps its work here
  void *progress;        // the store's own; nullptr before its first pass
  bool has_batch;        // keys collected and not yet deleted
  bool finished;         // no expired key left to collect
  // Whether idempotency.expire_rate paces the batches: batches of rows are;
  // a batch that is one statement run elsewhere (Citus) is not.
  bool paced;
  // Expired rows kept as they are because writing their tombstone failed
  // (a DBA's constraint, index or trigger refused it), and the first such
  // error, "SQLSTATE: message" in `context`; nullptr while there is none.
  int64 kept;
  const char *kept_reason;
};
static_assert(std::is_trivially_destructible_v<ExpiryRound>);

struct ExpiryBatch {
  int64 deleted;
  // Deleted, or skipped because another transaction was changing them: what
  // idempotency.expire_rate counts.
  int64 handled;
};

// The key table of a call, as its store found it.
struct KeyTable {
  Oid relid;
  // Tenant keys only (InvalidOid otherwise): the tenant's shard of the
  // table on this node, and the table's owner, who reads and writes it.
  Oid local_shard;
  Oid owner;
};
static_assert(std::is_trivially_destructible_v<KeyTable>);

// How one kind of key table is read and written: storage/keys.hpp (the
// local table) and storage/tenant_keys.hpp (Citus tenant keys). Stateless;
// what a call found is in its KeyTable.
class KeyBackend {
public:
  // Looks the key up. Under REPEATABLE READ or SERIALIZABLE, a row committed
  // by another transaction after this transaction's snapshot raises 40001.
  // Values are copied into the current memory context.
  virtual KeyProbe probe(const KeyTable &table, const KeyRef &key,
                         TimestampTz now) const = 0;
  // Stores a completed call's row, after deleting the expired row it
  // replaces - that row version of this key only, never whatever row holds
  // its address by now. The table's primary key is the final word: a second
  // row for one key can never commit.
  virtual StoredRow store(const KeyTable &table, const KeyRef &key,
                          const NewRow &row) const = 0;
  // Deletes a done or gone row of a key whose owner forgets it (`stored`, as
  // probe() found it: that row version of this key only). Returns false when
  // the row was deleted meanwhile (by expiry).
  virtual bool remove(const KeyTable &table, const KeyRef &key,
                      const KeyProbe &stored) const = 0;
  // Whether a stored row shows its key as in progress to other transactions
  // before it commits; if so a call lets go of its claim once the row is
  // written, else the claim covers the key until the transaction ends.
  virtual bool row_shows_in_progress() const = 0;

  // This kind's key table in this database where it holds keys on this
  // node: idempotency.keys; idempotency.tenant_keys where Citus distributes
  // it. InvalidOid where there is none.
  virtual Oid relation() const = 0;
  // For the role marks and DROP OWNED (storage/role_marks.hpp), on the table
  // `relid` (relation()) the caller has locked, whose scope column is
  // `scope_column`: the roles that have keys in it on this node, and the
  // deletion of one role's keys there with a snapshot taken now (returns
  // how many).
  virtual role_keys::Roles roles_with_keys(Oid relid,
                                           AttrNumber scope_column) const = 0;
  virtual uint64 delete_keys_of(Oid relid, AttrNumber scope_column,
                                Oid role) const = 0;

  // Expiry, in two steps the caller runs in transactions of its own:
  // collect the next expired keys (read-only; the worker holds
  // idempotency.keys in AccessShareLock), then delete them a batch at a time
  // (RowExclusiveLock), while round.has_batch. Each step needs a
  // transaction and an active snapshot.
  virtual void collect_expired(ExpiryRound &round, int batch_size) const = 0;
  virtual ExpiryBatch expire_batch(ExpiryRound &round,
                                   int batch_size) const = 0;

protected:
  ~KeyBackend() = default;
};

// A key table and the backend that reads and writes it: chosen once per
// call, a plain value the call's frames may hold.
class KeyStore {
public:
  KeyStore(const KeyBackend &backend, KeyTable table)
      : backend_(&backend), table_(table) {}

  KeyProbe probe(const KeyRef &key, TimestampTz now) const {
    return backend_->probe(table_, key, now);
  }
  StoredRow store(const KeyRef &key, const NewRow &row) const {
    return backend_->store(table_, key, row);
  }
  bool remove(const KeyRef &key, const KeyProbe &stored) const {
    return backend_->remove(table_, key, stored);
  }
  bool row_shows_in_progress() const {
    return backend_->row_shows_in_progress();
  }
  void collect_expired(ExpiryRound &round, int batch_size) const {
    backend_->collect_expired(round, batch_size);
  }
  ExpiryBatch expire_batch(ExpiryRound &round, int batch_size) const {
    return backend_->expire_batch(round, batch_size);
  }

private:
  const KeyBackend *backend_;
  KeyTable table_;
};
static_assert(std::is_trivially_destructible_v<KeyStore>);

// The store of `key`: idempotency.keys, or for a tenant key (has_tenant)
// idempotency.tenant_keys. Raises what storage::key_table() and
// tenant_keys::table_for() raise when the table cannot serve the key.
KeyStore key_store_for(const KeyRef &key);

// Every kind of key table, in the order expiry, the role marks and DROP
// OWNED visit them: idempotency.keys (storage/keys.hpp), then
// idempotency.tenant_keys (storage/tenant_keys.hpp).
constexpr int key_backend_count = 2;
const KeyBackend &key_backend(int index);

// The store of key_backend(index) for a round of expiry, which finds its
// table itself in each of its transactions (a no-op for tenant keys where
// the table does not exist or this node is not the Citus coordinator).
KeyStore expiry_store(int index);

// 23505: a stored row has the key's scope and digest but another key text.
[[noreturn]] void report_shared_digest();

// What the BEFORE INSERT row triggers did with a key's row.
enum class TriggeredRow {
  kept,    // written as they left it (changed or not)
  skipped, // a trigger returned NULL: no row
  moved,   // a trigger changed one of the `fixed` columns
};

// Raises 09000 unless `result` is kept: a BEFORE trigger on `table` skipped
// the row of idempotency key `key`, or changed its `fixed_columns` (named
// in the message). An empty `key` is a tombstone's (a call's key is never
// empty): its message names no key.
void check_key_row_kept(TriggeredRow result, const char *table,
                        const char *fixed_columns, const text *key);

// The extension's schema, idempotency, and the relations in it, found by
// name: the extension is not relocatable, so every object it made is there.
// Each lookup is PostgreSQL's syscache one (cheap); a schema renamed or
// dropped is seen at once.
namespace schema {

// The schema's OID; InvalidOid when it does not exist and `missing_ok`,
// else 3F000.
Oid oid(bool missing_ok);

// The relation `name` of the schema; InvalidOid when it or the schema does
// not exist.
Oid relation(const char *name);

} // namespace schema

// Columns of the tables the extension reads and writes, found by name: a
// DBA may add, drop and reorder others.

// The live column `name` of `desc`, nullptr when there is none.
Form_pg_attribute find_column(TupleDesc desc, const char *name);

// Whether a column of `type` can hold a key's scope, a role's oid: regrole,
// or the extension's own 4-byte by-value type for it.
bool fits_scope(Oid type);

} // namespace idempotency::storage
