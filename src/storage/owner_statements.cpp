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

int check_result(int rc, int expected) {
  if (rc != expected)
    elog(ERROR, "idempotency: statement on a key table failed: %s",
         SPI_result_code_string(rc));
  return rc;
}

} // namespace

void forget_plan(KeptPlan &kept) {
  if (kept.plan != nullptr)
    SPI_freeplan(kept.plan);
  kept.plan = nullptr;
}

int OwnerSpi::run(const char *sql, int nargs, Oid *types, Datum *values,
                  const char *nulls, bool read_only, int expected) {
  return check_result(
      SPI_execute_with_args(sql, nargs, types, values, nulls, read_only, 0),
      expected);
}

int OwnerSpi::run_kept(KeptPlan &kept, const char *sql, int nargs, Oid *types,
                       Datum *values, const char *nulls, bool read_only,
                       int expected, Snapshot snapshot) {
  if (kept.plan == nullptr || kept.first_type != types[0]) {
    forget_plan(kept);
    SPIPlanPtr plan = SPI_prepare_cursor(sql, nargs, types,
                                         kept.custom ? CURSOR_OPT_CUSTOM_PLAN
                                                     : CURSOR_OPT_GENERIC_PLAN);
    if (plan == nullptr)
      elog(ERROR,
           "idempotency: preparing a statement on a key table failed: %s",
           SPI_result_code_string(SPI_result));
    if (SPI_keepplan(plan) != 0)
      elog(ERROR, "idempotency: SPI_keepplan failed");
    kept.plan = plan;
    kept.first_type = types[0];
  }
  // Without a snapshot, the same as SPI_execute_plan.
  return check_result(SPI_execute_snapshot(kept.plan, values, nulls, snapshot,
                                           InvalidSnapshot, read_only, true, 0),
                      expected);
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

Saved begin_spi(Oid owner) {
  Saved saved;
  GetUserIdAndSecContext(&saved.user, &saved.context);
  SetUserIdAndSecContext(owner, saved.context | SECURITY_LOCAL_USERID_CHANGE);
  if (SPI_connect() != SPI_OK_CONNECT)
    elog(ERROR, "SPI_connect failed");
  return saved;
}

void finish_spi(const Saved &saved) {
  SPI_finish();
  SetUserIdAndSecContext(saved.user, saved.context);
}

} // namespace idempotency::storage::table_owner
