// A role that has keys in a database cannot be dropped until they are gone.
//
// A key is stored under its role's OID, and a role created after the drop
// may get that OID again (OID wraparound, pg_resetwal -o): the dropped
// role's keys would then be its keys. So the keys hold their role as the
// objects a role owns do, the PostgreSQL way: one shared dependency per role
// and database (a pg_shdepend row "privileges for column scope of table
// idempotency.keys", the mark), recorded the first time the role stores a
// key there. DROP ROLE then fails with SQLSTATE 2BP01 ("role ... cannot be
// dropped because some objects depend on it"), and DROP OWNED BY, run in
// each database as PostgreSQL's docs say for dropping a role, deletes the
// role's keys there and its mark (the event trigger below). REASSIGN OWNED
// leaves both: keys never pass to another role.
//
// The mark is an ACL dependency on the scope column, which nothing else
// records for a role that was never granted a privilege on that column:
// DROP OWNED (even without the trigger) and REASSIGN OWNED leave such a
// row alone, and a REVOKE removes it only from a role that had been granted
// a privilege on keys.scope itself.
//
// Marks are made only where the extension has its event trigger (0.7 and
// later): without it, DROP OWNED could not remove them.
#pragma once

#include "idempotency/pg.hpp"

extern "C" {
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

// Marks every role that has keys in this
// database and deletes the keys whose role no longer exists (which no role
// may ever reach again). Returns the number of keys deleted. Run by the
// update to 0.7 and by each round of the expiry worker; after pg_upgrade,
// which does not carry the marks, until the worker's first round.
int64 mark_key_roles();

// Whether this database's extension records roles (0.7 and later): the
// expiry worker leaves databases at older versions as they were.
bool database_marks_roles();

// What DROP OWNED does to keys, run by its event trigger before it:
// deletes the keys of `roles` (a list of RoleSpec) in this database and
// their marks, after PostgreSQL's own permission check for DROP OWNED.
void drop_owned_keys(const List *roles);

} // namespace idempotency::storage::role_marks
