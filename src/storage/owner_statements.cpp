#include "idempotency/storage/owner_statements.hpp"

extern "C" {
#include "access/htup_details.h"
#include "catalog/pg_class.h"
#include "executor/spi.h"
#include "miscadmin.h"
#include "utils/syscache.h"
}

namespace idempotency::storage {

namespace {

void check_result(int rc, int expected) {
  if (rc != expected)
    elog(ERROR, "idempotency: statement on a key table failed: %s",
         SPI_result_code_string(rc));
}

void prepare_if_needed(KeptPlan &kept, const char *sql, int nargs, Oid *types) {
  if (kept.plan != nullptr && kept.first_type == types[0])
    return;
  forget_plan(kept);
  // A generic plan for the local key table: parsed and planned once.
  SPIPlanPtr plan = SPI_prepare_cursor(sql, nargs, types,
                                       kept.custom ? CURSOR_OPT_CUSTOM_PLAN
                                                   : CURSOR_OPT_GENERIC_PLAN);
  if (plan == nullptr)
    elog(ERROR, "idempotency: preparing a statement on a key table failed: %s",
         SPI_result_code_string(SPI_result));
  if (SPI_keepplan(plan) != 0)
    elog(ERROR, "idempotency: SPI_keepplan failed");
  kept.plan = plan;
  kept.first_type = types[0];
}

} // namespace

void forget_plan(KeptPlan &kept) {
  if (kept.plan != nullptr)
    SPI_freeplan(kept.plan);
  kept.plan = nullptr;
}

int OwnerSpi::run(const char *sql, int nargs, Oid *types, Datum *values,
                  const char *nulls, bool read_only, int expected) {
  int rc =
      SPI_execute_with_args(sql, nargs, types, values, nulls, read_only, 0);
  check_result(rc, expected);
  return rc;
}

int OwnerSpi::run_kept(KeptPlan &kept, const char *sql, int nargs, Oid *types,
                       Datum *values, const char *nulls, bool read_only,
                       int expected) {
  prepare_if_needed(kept, sql, nargs, types);
  int rc = SPI_execute_plan(kept.plan, values, nulls, read_only, 0);
  check_result(rc, expected);
  return rc;
}

int OwnerSpi::run_kept_with_snapshot(KeptPlan &kept, const char *sql, int nargs,
                                     Oid *types, Datum *values,
                                     const char *nulls, Snapshot snapshot,
                                     int expected) {
  prepare_if_needed(kept, sql, nargs, types);
  int rc = SPI_execute_snapshot(kept.plan, values, nulls, snapshot,
                                InvalidSnapshot, false, true, 0);
  check_result(rc, expected);
  return rc;
}

} // namespace idempotency::storage

namespace idempotency::storage::table_owner {

Oid of(Oid relid) {
  HeapTuple tuple = SearchSysCache1(RELOID, ObjectIdGetDatum(relid));
  if (!HeapTupleIsValid(tuple))
    elog(ERROR, "cache lookup failed for relation %u", relid);
  Oid owner = reinterpret_cast<Form_pg_class>(GETSTRUCT(tuple))->relowner;
  ReleaseSysCache(tuple);
  return owner;
}

Saved become(Oid owner) {
  Saved saved;
  GetUserIdAndSecContext(&saved.user, &saved.context);
  SetUserIdAndSecContext(owner, saved.context | SECURITY_LOCAL_USERID_CHANGE);
  return saved;
}

void restore(const Saved &saved) {
  SetUserIdAndSecContext(saved.user, saved.context);
}

Saved begin_spi(Oid owner) {
  Saved saved = become(owner);
  if (SPI_connect() != SPI_OK_CONNECT)
    elog(ERROR, "SPI_connect failed");
  return saved;
}

void finish_spi(const Saved &saved) {
  SPI_finish();
  restore(saved);
}

} // namespace idempotency::storage::table_owner
