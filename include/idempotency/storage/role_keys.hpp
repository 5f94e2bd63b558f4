// The keys of one role, read and deleted by statements on the key tables as
// their owner (storage/table_owner.hpp), for the role marks
// (role_marks.hpp): which roles have keys, and the deletion of a role's
// keys. Every name in the statements is schema-qualified, every operator
// too. Each needs a transaction; results are palloc'd in the caller's
// memory context.
#pragma once

#include "idempotency/pg.hpp"

extern "C" {
#include "access/attnum.h"
#include "utils/relcache.h"
}

namespace idempotency::storage::role_keys {

struct Roles {
  uint64 count;
  Oid *oids;
};
static_assert(std::is_trivially_destructible_v<Roles>);

// The roles that have keys in idempotency.keys (`keys`, opened by the
// caller; its scope column is `scope_column`), read through the primary key
// (scope first) one role at a time, so that the cost grows with the number
// of roles, not of keys.
Roles in_keys(Relation keys, AttrNumber scope_column);

// Deletes the keys of `role` in idempotency.keys with a snapshot taken now:
// keys that transactions committed while the caller waited for the table's
// lock go too, even under REPEATABLE READ. Returns how many.
uint64 delete_in_keys(Relation keys, AttrNumber scope_column, Oid role);

// The same for a shard relation of idempotency.tenant_keys on this node
// (`shard`), as `owner` (the owner of idempotency.tenant_keys), whose scope
// column has type `scope_type`. No index starts with the scope there (the
// tenant comes first): in_shard reads the shard in full.
Roles in_shard(Oid shard, Oid owner);
uint64 delete_in_shard(Oid shard, Oid owner, Oid scope_type, Oid role);

} // namespace idempotency::storage::role_keys
