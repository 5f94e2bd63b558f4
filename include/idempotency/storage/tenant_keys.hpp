// idempotency.tenant_keys, which Citus distributes co-located with the
// business tables (docs/scale-out.md). A tenant's keys are read and written
// only on the node that holds its shard: elsewhere Citus would send the key
// and fn's writes through two connections to the same shard group, which it
// does not allow.
#pragma once

#include "idempotency/pg.hpp"
#include "idempotency/storage/key_store.hpp"

namespace idempotency::storage::tenant_keys {

// idempotency.tenant_keys, checked for `key`; 0A000 when the tenant's shard
// is on another node, 40001 when Citus is moving it here or moved it away.
// Takes the placement lock, so that no shard move ends while the request
// runs.
KeyTable table_for(const KeyRef &key);

// The type an untyped tenant gets; text where the table does not exist.
Oid tenant_type();

// store raises IK409 when a transaction that claimed the key on another
// node (around a shard move) committed it first.
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
