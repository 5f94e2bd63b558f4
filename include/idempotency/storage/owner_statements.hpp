// Statements on a key table run through SPI as the table's owner.
//
// Callers (and the role running DROP OWNED) have no rights on the key
// tables, row-level security would hide other roles' rows, and a trigger
// or default a DBA added runs with the owner's rights, as it would for the
// owner's own statement. The switch is PostgreSQL's SetUserIdAndSecContext
// with SECURITY_LOCAL_USERID_CHANGE (SET ROLE is refused meanwhile).
// Nothing here is a destructor: on an error, the (sub)transaction's abort
// restores the user and closes SPI. Every name in a statement is
// schema-qualified, every operator too: the caller's search_path plays no
// part.
#pragma once

#include "idempotency/pg.hpp"

extern "C" {
#include "executor/spi.h"
}

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

namespace idempotency::storage {

// A statement's plan, kept for the backend's life (OwnerSpi::run_kept).
// Zero-initialized: not prepared yet.
struct KeptPlan {
  Oid first_type; // the type of $1 it was prepared for
  SPIPlanPtr plan;
  // A custom plan, made at each execution, for a statement Citus routes:
  // Citus 13.2.2 and 14.0.1 add the shard's local plan to a generic plan
  // that routes a write at each execution instead of finding the one it
  // added (Citus pull request 8824), so a kept generic plan would grow
  // without bound, at the same cost per call.
  bool custom;
};
static_assert(std::is_trivially_destructible_v<KeptPlan>);

// Frees `kept`'s plan, if any; the next run_kept prepares it again. Not
// while the plan runs.
void forget_plan(KeptPlan &kept);

class OwnerSpi {
public:
  // Becomes `owner` and connects to SPI.
  explicit OwnerSpi(Oid owner) : saved_(table_owner::begin_spi(owner)) {}
  // Not a destructor: frames that call PostgreSQL hold only trivially
  // destructible values. On an error, the (sub)transaction's abort restores
  // the user and closes SPI.
  void finish() { table_owner::finish_spi(saved_); }
  // Runs `sql` once; an internal error unless SPI answers `expected`.
  int run(const char *sql, int nargs, Oid *types, Datum *values,
          const char *nulls, bool read_only, int expected);
  // The same through a plan kept for the backend's life: a statement is
  // parsed and planned (by Citus too) once, not per call. PostgreSQL's plan
  // cache replans it when the table changes; a plan made for another type
  // of $1 is made again. `sql` is read only when the plan is prepared.
  int run_kept(KeptPlan &kept, const char *sql, int nargs, Oid *types,
               Datum *values, const char *nulls, bool read_only, int expected);
  // run_kept with the snapshot `snapshot` instead of the transaction's
  // (SPI_execute_snapshot; no crosscheck).
  int run_kept_with_snapshot(KeptPlan &kept, const char *sql, int nargs,
                             Oid *types, Datum *values, const char *nulls,
                             Snapshot snapshot, int expected);

private:
  table_owner::Saved saved_;
};
static_assert(std::is_trivially_destructible_v<OwnerSpi>);

} // namespace idempotency::storage
