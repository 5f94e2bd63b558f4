// Running as a key table's owner.
//
// The extension's own statements and writes on its key tables run as the
// table's owner: callers (and the role running DROP OWNED) have no rights
// on the tables, row-level security would hide other roles' rows, and a
// trigger or default a DBA added runs with the owner's rights, as it would
// for the owner's own statement. The switch is PostgreSQL's
// SetUserIdAndSecContext with SECURITY_LOCAL_USERID_CHANGE (SET ROLE is
// refused meanwhile). Nothing here is a destructor: on an error, the
// (sub)transaction's abort restores the user and closes SPI.
#pragma once

#include "idempotency/pg.hpp"

namespace idempotency::storage::table_owner {

// The owner of relation `relid`, from the system cache; an internal error
// if there is no such relation.
Oid of(Oid relid);

// The user and security context to go back to.
struct Saved {
  Oid user;
  int context;
};
static_assert(std::is_trivially_destructible_v<Saved>);

// Makes `owner` the current user; restore() goes back.
Saved become(Oid owner);
void restore(const Saved &saved);

// become(owner), then SPI_connect (an internal error if it fails);
// finish_spi() is SPI_finish, then restore().
Saved begin_spi(Oid owner);
void finish_spi(const Saved &saved);

} // namespace idempotency::storage::table_owner
