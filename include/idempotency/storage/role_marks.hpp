// The role a key belongs to: the marks that keep a role with keys from
// being dropped, the statements that find and delete a role's keys
// (role_keys), and the I/O of the scope column's type (role_scope).
//
// A key is stored under its role's OID, which a role created after the drop
// may get again (OID wraparound, pg_resetwal -o), so a role with keys cannot
// be dropped until they are gone (docs/replication.md#dropped-roles). The
// mark is the pg_shdepend row PostgreSQL records for a privilege on the key
// table's scope column, which nothing else records for a role never granted
// one there: DROP ROLE fails with 2BP01, DROP OWNED only revokes privileges
// and REASSIGN OWNED leaves it alone. The event trigger on DROP OWNED
// deletes the role's keys and mark. A GRANT or REVOKE on the column deletes
// the marks of the roles it leaves without privileges: a second event
// trigger records them again (keep_marks_after_grant).
//
// Tenant keys on Citus are marked node by node, under that node's OID of the
// role, on its relation of the table (which shard moves leave in place); a
// moved shard's roles are marked on the new node by mark_key_roles(), which
// the expiry worker runs on every node.
//
// Marks are made only where the extension has its event trigger (0.7 and
// later): without it, DROP OWNED could not remove them.
#pragma once

#include "idempotency/pg.hpp"

extern "C" {
#include "access/attnum.h"
#include "nodes/parsenodes.h"
#include "nodes/pg_list.h"
#include "utils/relcache.h"
}

namespace idempotency::storage::role_marks {

// Makes sure `role` has its mark on `keys` (opened and locked by the
// caller). The first time per backend, role and table it looks the mark up;
// then it is remembered until the table's relcache entry is invalidated
// (DROP OWNED invalidates it). Role 0 (a key of no role) has no mark.
void ensure(Relation keys, AttrNumber scope_column, Oid role);

// The same for this node's relation of idempotency.tenant_keys, which the
// caller holds in ROW EXCLUSIVE mode at least, so that a DROP OWNED that
// deleted the role's marks has committed (and made this backend forget
// them), or waits.
void ensure_tenant(Oid tenant_keys, Oid role);

// Marks every role that has keys in this database (and in the tenant key
// shards on this node) and deletes the keys of roles that no longer exist,
// which no role may ever reach again; returns how many it deleted. Run by
// the update to 0.7 and by each round of the expiry worker (pg_upgrade does
// not carry the marks).
int64 mark_key_roles();

// Whether this database's extension records roles (0.7 and later).
bool database_marks_roles();

// Run by the event trigger idempotency_keep_role_marks at the end of a GRANT
// or REVOKE: when `grant` names a key table (or all tables of its schema),
// marks again every role with keys there whose mark is missing. Keys of
// roles that are gone are left to mark_key_roles().
void keep_marks_after_grant(const GrantStmt *grant);

// Run by the event trigger before DROP OWNED: deletes the keys of `roles` (a
// list of RoleSpec) in this database and the tenant key shards on this
// node, and their marks, after PostgreSQL's own permission check.
void drop_owned_keys(const List *roles);

// A mark recorded by a (sub)transaction that does not commit goes with it,
// so every remembered role is forgotten then.
void at_commit();
void at_abort();
void at_subtransaction_abort();

} // namespace idempotency::storage::role_marks

// Which roles have keys, and the deletion of a role's keys, by statements
// run as the key table's owner (storage/owner_statements.hpp). Each needs a
// transaction; results are palloc'd in the caller's memory context.
namespace idempotency::storage::role_keys {

struct Roles {
  uint64 count;
  Oid *oids;
};
static_assert(std::is_trivially_destructible_v<Roles>);

// The roles with keys in idempotency.keys, read through the primary key one
// role at a time, so that the cost grows with the number of roles, not keys.
Roles in_keys(Oid keys, AttrNumber scope_column);

// Deletes the keys of `role` with a snapshot taken now: keys committed while
// the caller waited for the table's lock go too, even under REPEATABLE READ.
// Returns how many.
uint64 delete_in_keys(Oid keys, AttrNumber scope_column, Oid role);

// The same for a shard of idempotency.tenant_keys on this node, as `owner`.
// No index starts with the scope there: in_shard reads the shard in full.
Roles in_shard(Oid shard, Oid owner);
uint64 delete_in_shard(Oid shard, Oid owner, Oid scope_type, Oid role);

} // namespace idempotency::storage::role_keys

// The I/O functions of idempotency.role_scope (see role_marks.cpp).
namespace idempotency::storage {

Datum role_scope_in(FunctionCallInfo fcinfo);
Datum role_scope_out(FunctionCallInfo fcinfo);
Datum role_scope_recv(FunctionCallInfo fcinfo);
Datum role_scope_send(FunctionCallInfo fcinfo);

} // namespace idempotency::storage
