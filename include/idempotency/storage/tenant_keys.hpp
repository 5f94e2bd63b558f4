// idempotency.tenant_keys, which Citus distributes co-located with the business
// tables (docs/scale-out.md). A tenant's keys are read and written only on the
// node that holds its shard: elsewhere Citus would send the key and fn's writes
// through two connections to one shard group, which it does not allow.
#pragma once

#include "idempotency/pg.hpp"
#include "idempotency/storage/key_store.hpp"

namespace idempotency::storage::tenant_keys {

// idempotency.tenant_keys, checked for `key`; 0A000 when the tenant's shard
// is on another node, 40001 when Citus is moving it here or moved it away.
// Takes the placement lock: no shard move ends while the request runs.
KeyTable table_for(const KeyRef &key);

// The type an untyped tenant gets; text where the table does not exist.
Oid tenant_type();

// The store of KeyStore's tenant kind (storage/key_store.hpp). store raises
// IK409 when a transaction that claimed the key on another node (around a shard
// move) committed it first. relation() is the table where Citus distributes it;
// its roles and keys are those of the shards on this node.
KeyProbe probe(const KeyTable &table, const KeyRef &key, TimestampTz now);
StoredRow store(const KeyTable &table, const KeyRef &key, const NewRow &row);
bool remove(const KeyTable &table, const KeyRef &key, const KeyProbe &stored);
Oid relation();
role_keys::Roles roles_with_keys(Oid relid, AttrNumber scope_column);
uint64 delete_keys_of(Oid relid, AttrNumber scope_column, Oid role);
void collect_expired(ExpiryRound &round, int batch_size);
ExpiryBatch expire_batch(ExpiryRound &round, int batch_size);

} // namespace idempotency::storage::tenant_keys
