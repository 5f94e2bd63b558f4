// The pg_shdepend rows that mark a role on a key table (role_marks.hpp):
// a shared dependency of ACL kind (deptype 'a') of a column of a table of
// this database on a role, the kind PostgreSQL records for a privilege
// granted on that column. Only these three functions read or write them,
// writing through the server's own updateAclDependencies(), as GRANT and
// REVOKE on the column do. Each needs a transaction.
#pragma once

#include "idempotency/pg.hpp"

extern "C" {
#include "access/attnum.h"
}

namespace idempotency::storage::shared_dependency {

// Whether `role` has such a row on column `column` of `relid`, read through
// pg_shdepend's index on the referenced object (a role has few rows).
bool exists(Oid relid, AttrNumber column, Oid role);

// Records the row as a GRANT on the column to `role` would: nothing for a
// pinned role (the bootstrap superuser, which can never be dropped);
// otherwise `role` locked against a concurrent DROP ROLE until the
// transaction ends, 42704 if it is gone, then the row.
void record(Oid relid, AttrNumber column, Oid role);

// Deletes the rows as a REVOKE on the column from `role` would (there may
// be more than one: a GRANT on the column to a marked role adds the
// server's own).
void remove(Oid relid, AttrNumber column, Oid role);

} // namespace idempotency::storage::shared_dependency
