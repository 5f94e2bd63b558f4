// idempotency.tenant_keys: the key table Citus distributes co-located with
// the business tables (created by idempotency.distribute_keys(); primary key
// (tenant, scope, key_digest)), read and written by the tenant_* functions.
//
// A call reads the tenant's shard on this node directly and writes through
// statements Citus routes to it (run here by its local executor, in the
// call's transaction, as the table's owner), under Citus's share lock on the
// shard's placement metadata, held until the transaction ends. A shard move
// takes that lock in exclusive mode for its switch-over, so it waits for a
// request that wrote a key to the old placement and carries the key along,
// and a request during the switch-over waits, then finds the shard gone
// (40001).
//
// A tenant's keys are read and written only on the node that holds its
// shard, so that the call, fn and the key commit as one local transaction
// and the claim locks are all taken on that node. Anywhere else the call is
// refused (0A000): Citus would send the key through the owner's connection
// and fn's writes through the caller's, to the same shard group, which it
// does not allow.
#pragma once

#include "idempotency/pg.hpp"
#include "idempotency/storage/key_store.hpp"

namespace idempotency::storage::tenant_keys {

// idempotency.tenant_keys, checked for `key`: 42P01 when it does not exist,
// 55000 when Citus does not distribute it, 42804 when the tenant is not of
// its tenant column's type, 0A000 when the tenant's shard is on another node,
// 40001 when Citus is moving it here or moved it away. Takes the placement
// lock, so that no shard move ends while the request runs.
KeyTable table_for(const KeyRef &key);

// The type of idempotency.tenant_keys's tenant column, which a tenant_*
// call's untyped tenant gets; text where the table does not exist.
Oid tenant_type();

// idempotency.tenant_keys as a KeyBackend. store raises 40001 when Citus
// moved the tenant's shard away while the request ran (possible only when
// the lock table_for took went with a subtransaction that rolled back), and
// IK409 when a transaction that claimed the key on another node (around a
// shard move) committed it first. Expiry runs only on the coordinator: Citus
// runs its statements on every shard, wherever it is now.
class Backend final : public KeyBackend {
public:
  KeyProbe probe(const KeyTable &table, const KeyRef &key,
                 TimestampTz now) const override;
  StoredRow store(const KeyTable &table, const KeyRef &key,
                  const NewRow &row) const override;
  bool remove(const KeyTable &table, const KeyRef &key,
              const KeyProbe &stored) const override;
  // Read with an MVCC snapshot, which hides rows of open transactions.
  bool row_shows_in_progress() const override { return false; }
  // Where Citus distributes it, the table's relation on this node; its
  // roles and keys are those of the shards on this node.
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
