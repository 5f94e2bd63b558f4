// The role a key belongs to: the marks that keep a role with keys from
// being dropped, the statements that find and delete a role's keys
// (role_keys), and the I/O of the scope column's type (role_scope, last).
//
// A key is stored under its role's OID, which a role created after the drop
// may get again (OID wraparound, pg_resetwal -o): so a role that has keys in
// a database cannot be dropped until they are gone
// (docs/replication.md#dropped-roles). The mark, recorded the first time a
// role stores a key in a key table, is the shared dependency PostgreSQL
// records for a privilege on the table's scope column (pg_shdepend, ACL
// kind), which nothing else records for a role never granted one there:
// DROP ROLE then fails with 2BP01, DROP OWNED (even without the event
// trigger) only revokes privileges, and REASSIGN OWNED leaves it alone. The
// event trigger on DROP OWNED deletes the role's keys and its mark. A GRANT
// or REVOKE that changes the column's privileges deletes the ACL
// dependencies of every role that leaves them, the mark with them: the
// second event trigger records the marks again (keep_marks_after_grant).
//
// Tenant keys on Citus (idempotency.tenant_keys) are marked node by node,
// under that node's OID of the role, on its relation of the table (the
// coordinator's table or a worker's shell, which shard moves leave in
// place); Citus runs DROP ROLE and DROP OWNED on every node. A shard moved
// to a node where its roles have no mark keeps its old node's mark;
// mark_key_roles(), run by the expiry worker on every node, marks them on
// the new one.
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

// Makes sure `role` has its mark on `keys` (idempotency.keys, opened and
// locked by the caller), whose scope column is `scope_column`. The first
// time per backend, role and table it looks the mark up (and records it if
// missing); then it is remembered until the table's relcache entry is
// invalidated (DROP OWNED invalidates it), so a call pays a comparison.
// Role 0 (a key of no role) has no mark.
void ensure(Relation keys, AttrNumber scope_column, Oid role);

// The same for a tenant key stored on this node: `tenant_keys` is this
// node's relation of idempotency.tenant_keys, which the caller holds at
// least in ROW EXCLUSIVE mode (so that a DROP OWNED that deleted the role's
// marks has committed, and made this backend forget them, or waits).
void ensure_tenant(Oid tenant_keys, Oid role);

// Marks every role that has keys in this database - in idempotency.keys,
// and in the shards of idempotency.tenant_keys on this node - and deletes
// the keys whose role no longer exists (which no role
// may ever reach again). Returns the number of keys deleted. Run by the
// update to 0.7 and by each round of the expiry worker; after pg_upgrade,
// which does not carry the marks, until the worker's first round.
int64 mark_key_roles();

// Whether this database's extension records roles (0.7 and later): the
// expiry worker leaves databases at older versions as they were.
bool database_marks_roles();

// Run at the end of a GRANT or REVOKE (the event trigger
// idempotency_keep_role_marks, ddl_command_end): when `grant` names a key
// table of this database (idempotency.keys, or this node's relation of a
// distributed idempotency.tenant_keys) - itself, or all tables of its
// schema - every role that has keys in it is marked again where its mark
// is missing, at the cost of one primary-key probe and one pg_shdepend
// lookup per role. Keys of roles that are gone are left to
// mark_key_roles(). Any other GRANT or REVOKE costs a name lookup.
void keep_marks_after_grant(const GrantStmt *grant);

// What DROP OWNED does to keys, run by its event trigger before it:
// deletes the keys of `roles` (a list of RoleSpec) in this database (with
// their tenant keys in the shards on this node) and their marks, after
// PostgreSQL's own permission check for DROP OWNED.
void drop_owned_keys(const List *roles);

// Called by entry/transaction.cpp, the extension's transaction callbacks: a
// mark recorded by a transaction, or by a subtransaction, that does not
// commit goes with it, so every remembered role is forgotten then.
void at_commit();
void at_abort();
void at_subtransaction_abort();

} // namespace idempotency::storage::role_marks

// The keys of one role, read and deleted by statements on the key tables as
// their owner (storage/owner_statements.hpp), for the role marks (above) and
// the key tables' KeyBackend::roles_with_keys and delete_keys_of: which
// roles have keys, and the deletion of a role's keys. Every name in the
// statements is schema-qualified, every operator too. Each needs a transaction;
// results are palloc'd in the caller's memory context.
namespace idempotency::storage::role_keys {

struct Roles {
  uint64 count;
  Oid *oids;
};
static_assert(std::is_trivially_destructible_v<Roles>);

// The roles that have keys in idempotency.keys (`keys`; its scope column is
// `scope_column`), read through the primary key (scope first) one role at a
// time, so that the cost grows with the number of roles, not of keys.
Roles in_keys(Oid keys, AttrNumber scope_column);

// Deletes the keys of `role` in idempotency.keys with a snapshot taken now:
// keys that transactions committed while the caller waited for the table's
// lock go too, even under REPEATABLE READ. Returns how many.
uint64 delete_in_keys(Oid keys, AttrNumber scope_column, Oid role);

// The same for a shard relation of idempotency.tenant_keys on this node
// (`shard`), as `owner` (the owner of idempotency.tenant_keys), whose scope
// column has type `scope_type`. No index starts with the scope there (the
// tenant comes first): in_shard reads the shard in full.
Roles in_shard(Oid shard, Oid owner);
uint64 delete_in_shard(Oid shard, Oid owner, Oid scope_type, Oid role);

} // namespace idempotency::storage::role_keys

// The SQL type idempotency.role_scope: a role's OID inside the cluster, its
// name in text and binary I/O (see role_marks.cpp). Bodies of the type's
// I/O functions, declared in entry/functions.cpp.
namespace idempotency::storage {

Datum role_scope_in(FunctionCallInfo fcinfo);
Datum role_scope_out(FunctionCallInfo fcinfo);
Datum role_scope_recv(FunctionCallInfo fcinfo);
Datum role_scope_send(FunctionCallInfo fcinfo);

} // namespace idempotency::storage
