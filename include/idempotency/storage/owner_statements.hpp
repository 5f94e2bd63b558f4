// Statements on a key table run through SPI as the table's owner: callers have
// no rights on the key tables, row-level security would hide other roles' rows,
// and a DBA's trigger or default runs with the owner's rights. The switch is
// SetUserIdAndSecContext with SECURITY_LOCAL_USERID_CHANGE (SET ROLE is refused
// meanwhile). Nothing here is a destructor: on an error, the (sub)transaction's
// abort restores the user and closes SPI. Every name and operator in a
// statement is schema-qualified: search_path plays no part.
#pragma once

#include "idempotency/pg.hpp"

extern "C" {
#include "executor/spi.h"
}

namespace idempotency::storage::table_owner {

// An internal error if there is none.
Oid of(Oid relid);

struct Saved {
  Oid user;
  int context;
};
static_assert(std::is_trivially_destructible_v<Saved>);

// Makes `owner` the current user and connects to SPI; finish_spi() undoes both.
Saved begin_spi(Oid owner);
void finish_spi(const Saved &saved);

} // namespace idempotency::storage::table_owner

namespace idempotency::storage {

// A plan kept for the backend's life (OwnerSpi::run_kept); zero: not prepared.
struct KeptPlan {
  Oid first_type; // the type of $1 it was prepared for
  SPIPlanPtr plan;
  // A custom plan for a statement Citus routes: Citus 13.2.2 and 14.0.1 add the
  // shard's local plan to a generic plan at each execution (Citus pull request
  // 8824), so a kept generic plan would grow without bound.
  bool custom;
};
static_assert(std::is_trivially_destructible_v<KeptPlan>);

// Frees `kept`'s plan, if any, for run_kept to make again; not while it runs.
void forget_plan(KeptPlan &kept);

class OwnerSpi {
public:
  explicit OwnerSpi(Oid owner) : saved_(table_owner::begin_spi(owner)) {}
  void finish() { table_owner::finish_spi(saved_); }
  // Runs `sql` once; an internal error unless SPI answers `expected`.
  int run(const char *sql, int nargs, Oid *types, Datum *values,
          const char *nulls, bool read_only, int expected);
  // The same through a kept plan, parsed and planned (by Citus too) once;
  // PostgreSQL's plan cache replans it when the table changes, and a plan
  // for another type of $1 is made again. `sql` is read only to prepare it.
  // With `snapshot`, runs with that snapshot instead of the transaction's.
  int run_kept(KeptPlan &kept, const char *sql, int nargs, Oid *types,
               Datum *values, const char *nulls, bool read_only, int expected,
               Snapshot snapshot = InvalidSnapshot);

private:
  table_owner::Saved saved_;
};
static_assert(std::is_trivially_destructible_v<OwnerSpi>);

} // namespace idempotency::storage
