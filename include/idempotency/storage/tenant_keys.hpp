// Tenant keys: idempotency.tenant_keys, the key table Citus distributes with
// the business tables, co-located with them by their distribution column.
//
// idempotency.distribute_keys('accounts') creates it (see idempotency.sql):
// the tenant column has the type of accounts' distribution column,
// and the primary key is (tenant, scope, key_digest), so that a tenant's keys
// sit in the shard beside that tenant's rows. Calls of the tenant_* SQL
// functions read and write it here.
//
// A call reads the tenant's shard relation on this node by its primary key,
// and writes the table through statements Citus routes to that shard (its
// local executor runs them here, in the call's transaction), each prepared
// once per backend and kept, run as the table's owner: callers have no
// rights on the table, and its triggers fire with the owner's rights. Both
// happen under the lock Citus's own writes take: Citus's share lock on the
// shard's placement metadata (lock_shard_metadata), taken before the
// placement is checked and held until the transaction ends. A shard move
// takes that lock in exclusive mode for its final switch-over, so it waits
// for a request that wrote a key to the old placement and carries the key
// with the rest of the shard (its logical replication catches up after the
// lock), and a request that comes during the switch-over waits for it and
// then finds the shard gone (40001). Citus's metadata is read through its
// SQL API (storage/citus.hpp).
//
// A tenant's keys are only read and written on the node that holds the
// tenant's shard: the call, fn and the key then are one local transaction on
// that node (a function delegated by Citus to it), which commits as one, and
// the claim locks that turn a concurrent duplicate into IK409 are all taken
// on that node. Anywhere else the call is refused (0A000): Citus would send
// the key through the owner's connection and fn's writes through the
// caller's, to the same shard group, which it does not allow.
#pragma once

#include "idempotency/pg.hpp"
#include "idempotency/storage/key_store.hpp"

namespace idempotency::storage::tenant_keys {

// idempotency.tenant_keys, checked for `key`: 42P01 when it does not exist,
// 55000 when Citus does not distribute it, 42804 when the tenant is not of
// its tenant column's type, 0A000 when the tenant's shard is on another node,
// 40001 when it is on another node because Citus is moving it here or moved
// it away (a relation of the shard is on this node). Takes Citus's share lock
// on the shard's placement until the transaction ends, so that no shard move
// ends while the request runs.
KeyTable table_for(const KeyRef &key);

// The type of idempotency.tenant_keys's tenant column, which a tenant_*
// call's untyped tenant gets; text where the table does not exist.
Oid tenant_type();

// idempotency.tenant_keys as a KeyBackend (storage/key_store.hpp):
// - probe reads the tenant's shard on this node by its primary key, with the
//   snapshot a statement would take (never in_progress: rows of open
//   transactions are not seen; the claim lock stands for them);
// - store records the key's role on this node (storage/role_marks.hpp: a
//   role with tenant keys cannot be dropped), inserts the row through Citus
//   (its triggers fire, its constraints are checked; a trigger that skips the
//   row or moves it to another key raises 09000), and raises 40001 when Citus
//   moved the tenant's shard to another node while the request ran (the
//   request must run again, there; possible only when the lock table_for
//   took went with a subtransaction that rolled back). A row of
//   the key committed by a transaction that claimed it on another node
//   (possible only around a shard move) makes the insert fail on the primary
//   key: raised as IK409;
// - remove deletes the key's live row through Citus; false when there is
//   none;
// - expiry is one batch: one DELETE through Citus, which runs it on every
//   shard, on the node that holds the shard now (so a shard moved by the
//   rebalancer is neither missed nor visited twice). A no-op where
//   idempotency.tenant_keys does not exist or this node is not the Citus
//   coordinator (the workers see the same table through Citus's metadata:
//   one node expires it for all).
class Backend final : public KeyBackend {
public:
  KeyProbe probe(const KeyTable &table, const KeyRef &key,
                 TimestampTz now) const override;
  StoredRow store(const KeyTable &table, const KeyRef &key,
                  const NewRow &row) const override;
  bool remove(const KeyTable &table, const KeyRef &key,
              const KeyProbe &stored) const override;
  // Read through Citus with an MVCC snapshot: the claim must cover the key
  // until the transaction ends.
  bool row_shows_in_progress() const override { return false; }
  // Where Citus distributes it; on every node the table's local relation
  // (the coordinator's table, a worker's shell), whose rows are in the
  // shards: the roles and keys of the shards placed on this node.
  Oid relation() const override;
  role_keys::Roles roles_with_keys(Oid relid,
                                   AttrNumber scope_column) const override;
  uint64 delete_keys_of(Oid relid, AttrNumber scope_column,
                        Oid role) const override;
  void collect_expired(ExpiryRound &round, int batch_size) const override;
  ExpiryBatch expire_batch(ExpiryRound &round, int batch_size) const override;
};

extern const Backend backend;

} // namespace idempotency::storage::tenant_keys
