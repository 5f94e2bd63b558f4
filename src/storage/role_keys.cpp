#include "idempotency/storage/role_keys.hpp"

#include "idempotency/storage/table_owner.hpp"

extern "C" {
#include "access/tupdesc.h"
#include "catalog/pg_type.h"
#include "executor/spi.h"
#include "utils/builtins.h"
#include "utils/lsyscache.h"
#include "utils/rel.h"
#include "utils/snapmgr.h"
}

namespace idempotency::storage::role_keys {

namespace {

Oid scope_type(Relation keys, AttrNumber scope_column) {
  return TupleDescAttr(RelationGetDescr(keys), scope_column - 1)->atttypid;
}

// The schema of the operators that compare the scope column: the
// extension's role type, or regrole (which the column may still be).
const char *scope_operator_schema(Oid type) {
  return type == REGROLEOID ? "pg_catalog" : "idempotency";
}

const char *qualified_name(Oid relid) {
  return quote_qualified_identifier(
      get_namespace_name(get_rel_namespace(relid)), get_rel_name(relid));
}

// The first column of SPI_tuptable (a role), copied out of SPI's memory.
// Inside SPI.
Roles roles_read() {
  Roles roles{SPI_processed, nullptr};
  roles.oids = static_cast<Oid *>(
      SPI_palloc(sizeof(Oid) * (roles.count > 0 ? roles.count : 1)));
  for (uint64 i = 0; i < roles.count; i++) {
    bool isnull;
    roles.oids[i] = DatumGetObjectId(SPI_getbinval(
        SPI_tuptable->vals[i], SPI_tuptable->tupdesc, 1, &isnull));
  }
  return roles;
}

// Runs `sql` (a DELETE whose $1 is the scope) for `role` with a snapshot
// taken now. Inside SPI.
uint64 delete_with_latest_snapshot(const char *sql, Oid type, Oid role,
                                   const char *what) {
  Datum value = ObjectIdGetDatum(role);
  SPIPlanPtr plan = SPI_prepare(sql, 1, &type);
  if (plan == nullptr)
    elog(ERROR, "idempotency: preparing the deletion of a role's %s failed",
         what);
  int rc = SPI_execute_snapshot(plan, &value, nullptr, GetLatestSnapshot(),
                                InvalidSnapshot, false, false, 0);
  if (rc != SPI_OK_DELETE)
    elog(ERROR, "idempotency: deleting a role's %s failed: %s", what,
         SPI_result_code_string(rc));
  SPI_freeplan(plan);
  return SPI_processed;
}

} // namespace

Roles in_keys(Relation keys, AttrNumber scope_column) {
  char *sql = psprintf(
      "WITH RECURSIVE r (scope) AS ("
      "  (SELECT k.scope FROM idempotency.keys AS k ORDER BY k.scope LIMIT 1)"
      "  UNION ALL"
      "  SELECT (SELECT k.scope FROM idempotency.keys AS k"
      "           WHERE k.scope OPERATOR(%s.>) r.scope"
      "           ORDER BY k.scope LIMIT 1)"
      "    FROM r WHERE r.scope IS NOT NULL)"
      " SELECT r.scope FROM r WHERE r.scope IS NOT NULL",
      scope_operator_schema(scope_type(keys, scope_column)));
  table_owner::Saved saved = table_owner::begin_spi(keys->rd_rel->relowner);
  int rc = SPI_execute(sql, true, 0);
  if (rc != SPI_OK_SELECT)
    elog(ERROR, "idempotency: listing the roles that have keys failed: %s",
         SPI_result_code_string(rc));
  Roles roles = roles_read();
  table_owner::finish_spi(saved);
  return roles;
}

uint64 delete_in_keys(Relation keys, AttrNumber scope_column, Oid role) {
  Oid type = scope_type(keys, scope_column);
  char *sql = psprintf("DELETE FROM idempotency.keys AS k WHERE k.scope "
                       "OPERATOR(%s.=) $1",
                       scope_operator_schema(type));
  table_owner::Saved saved = table_owner::begin_spi(keys->rd_rel->relowner);
  uint64 deleted = delete_with_latest_snapshot(sql, type, role, "keys");
  table_owner::finish_spi(saved);
  return deleted;
}

Roles in_shard(Oid shard, Oid owner) {
  char *sql =
      psprintf("SELECT DISTINCT k.scope FROM %s AS k", qualified_name(shard));
  table_owner::Saved saved = table_owner::begin_spi(owner);
  if (SPI_execute(sql, true, 0) != SPI_OK_SELECT)
    elog(ERROR, "idempotency: listing the roles that have tenant keys failed");
  Roles roles = roles_read();
  table_owner::finish_spi(saved);
  return roles;
}

uint64 delete_in_shard(Oid shard, Oid owner, Oid scope_type, Oid role) {
  char *sql = psprintf("DELETE FROM %s AS k WHERE k.scope "
                       "OPERATOR(idempotency.=) $1",
                       qualified_name(shard));
  table_owner::Saved saved = table_owner::begin_spi(owner);
  uint64 deleted =
      delete_with_latest_snapshot(sql, scope_type, role, "tenant keys");
  table_owner::finish_spi(saved);
  return deleted;
}

} // namespace idempotency::storage::role_keys
