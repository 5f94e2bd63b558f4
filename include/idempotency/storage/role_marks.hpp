// The marks that keep a role with keys from being dropped: the pg_shdepend row
// of a privilege on the key table's scope column, which DROP OWNED's event
// trigger deletes with the keys (docs/replication.md#dropped-roles). Marks are
// made only where that trigger exists (0.7 and later). Also the statements that
// find and delete a role's keys, and the scope column's type.
#pragma once

#include "idempotency/pg.hpp"

extern "C" {
#include "access/attnum.h"
#include "nodes/parsenodes.h"
#include "nodes/pg_list.h"
#include "utils/relcache.h"
}

namespace idempotency::storage::role_marks {

// Makes sure `role` has its mark on `keys` (opened and locked by the caller),
// looked up once per backend until the table is invalidated; role 0 has none.
void ensure(Relation keys, AttrNumber scope_column, Oid role);

// The same for this node's relation of idempotency.tenant_keys, which the
// caller holds in ROW EXCLUSIVE mode at least, so that a DROP OWNED has
// committed (and made this backend forget its marks), or waits.
void ensure_tenant(Oid tenant_keys, Oid role);

// Marks every role with keys here and deletes the keys of roles that no
// longer exist; returns how many it deleted. Run by the update to 0.7 and by
// each round of the expiry worker (pg_upgrade does not carry the marks).
int64 mark_key_roles();

// Whether this database's extension records roles (0.7 and later).
bool database_marks_roles();

// Run at the end of a GRANT or REVOKE: when `grant` names a key table, marks
// again every role with keys there whose mark is missing.
void keep_marks_after_grant(const GrantStmt *grant);

// Run before DROP OWNED: deletes the keys and marks of `roles` (a list of
// RoleSpec), after PostgreSQL's own permission check.
void drop_owned_keys(const List *roles);

// An abort undoes the (sub)transaction's marks: remembered roles are forgotten.
void at_commit();
void at_abort();
void at_subtransaction_abort();

} // namespace idempotency::storage::role_marks

// Statements run as the key table's owner. Each needs a transaction.
namespace idempotency::storage::role_keys {

struct Roles {
  uint64 count;
  Oid *oids;
};
static_assert(std::is_trivially_destructible_v<Roles>);

// One role at a time through the primary key: cost grows with roles, not keys.
Roles in_keys(Oid keys, AttrNumber scope_column);

// With a snapshot taken now: keys committed while the caller waited for the
// table's lock go too, even under REPEATABLE READ.
uint64 delete_in_keys(Oid keys, AttrNumber scope_column, Oid role);

// For the shards of idempotency.tenant_keys on this node (a List of their
// relations), which have no index that starts with the scope: read in full.
Roles in_shards(List *shards, Oid owner);
uint64 delete_in(Oid relid, Oid owner, Oid scope_type, Oid role);

} // namespace idempotency::storage::role_keys

namespace idempotency::storage {

Datum role_scope_in(FunctionCallInfo fcinfo);
Datum role_scope_out(FunctionCallInfo fcinfo);
Datum role_scope_recv(FunctionCallInfo fcinfo);
Datum role_scope_send(FunctionCallInfo fcinfo);

} // namespace idempotency::storage
