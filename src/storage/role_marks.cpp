#include "idempotency/storage/role_marks.hpp"

#include "idempotency/storage/key_store.hpp"
#include "idempotency/storage/owner_statements.hpp"

#include "idempotency/compat.hpp"

extern "C" {
#include "access/genam.h"
#include "access/htup_details.h"
#include "access/table.h"
#include "catalog/dependency.h"
#include "catalog/namespace.h"
#include "catalog/pg_authid.h"
#include "catalog/pg_class.h"
#include "catalog/pg_shdepend.h"
#include "catalog/pg_type.h"
#include "commands/event_trigger.h"
#include "executor/spi.h"
#include "libpq/pqformat.h"
#include "miscadmin.h"
#include "storage/lmgr.h"
#include "utils/acl.h"
#include "utils/builtins.h"
#include "utils/fmgroids.h"
#include "utils/inval.h"
#include "utils/lsyscache.h"
#include "utils/regproc.h"
#include "utils/rel.h"
#include "utils/snapmgr.h"
#include "utils/syscache.h"
}

namespace idempotency::storage::role_marks {

namespace {

// A mark is the shared dependency of ACL kind a GRANT on the column
// records, looked up by the role (a role has few rows).
bool mark_exists(Oid relid, AttrNumber column, Oid role) {
  Relation shdepend = table_open(SharedDependRelationId, AccessShareLock);
  ScanKeyData keys[2];
  ScanKeyInit(&keys[0], Anum_pg_shdepend_refclassid, BTEqualStrategyNumber,
              F_OIDEQ, ObjectIdGetDatum(AuthIdRelationId));
  ScanKeyInit(&keys[1], Anum_pg_shdepend_refobjid, BTEqualStrategyNumber,
              F_OIDEQ, ObjectIdGetDatum(role));
  SysScanDesc scan = systable_beginscan(shdepend, SharedDependReferenceIndexId,
                                        true, nullptr, 2, keys);
  bool found = false;
  HeapTuple tuple;
  while (!found && (tuple = systable_getnext(scan)) != nullptr) {
    auto *row = reinterpret_cast<Form_pg_shdepend>(GETSTRUCT(tuple));
    found = row->dbid == MyDatabaseId && row->classid == RelationRelationId &&
            row->objid == relid && row->objsubid == column &&
            row->deptype == SHARED_DEPENDENCY_ACL;
  }
  systable_endscan(scan);
  table_close(shdepend, NoLock);
  return found;
}

// updateAclDependencies() pfrees its arrays of roles. It records nothing for
// a pinned role (which cannot be dropped), locks the role against a
// concurrent DROP ROLE (42704 if it is gone), and is given no owner: the
// table's owner may change while a role keeps its keys.
Oid *one_role(Oid role) {
  Oid *roles = static_cast<Oid *>(palloc(sizeof(Oid)));
  roles[0] = role;
  return roles;
}

constexpr const char *event_trigger_name = "idempotency_drop_owned_keys";

// Roles this backend knows marked, per kind of key table; a full set resets.
constexpr int max_remembered = 1024;

struct Remembered {
  Oid relid;    // InvalidOid: nothing known
  bool marking; // whether its database has the event trigger (0.7 on)
  int count;
  Oid roles[max_remembered];
};
static_assert(std::is_trivially_destructible_v<Remembered>);

Remembered remembered[lengthof(key_table_kinds)];
bool callbacks_registered;
// One flag for all tables: one looked up again remembers uncommitted marks too.
bool recorded_in_transaction;

void forget(Oid relid) {
  for (Remembered &table : remembered)
    if (relid == InvalidOid || relid == table.relid) {
      table.relid = InvalidOid;
      table.count = 0;
    }
}

// DROP OWNED, ALTER EXTENSION UPDATE and any other table change send one.
void forget_on_relcache_change(Datum, Oid relid) { forget(relid); }

// The update to 0.7 creating the event trigger (or DROP EXTENSION dropping
// it) does not change idempotency.tenant_keys's definition.
void forget_on_event_trigger_change(Datum, compat::SysCacheIdentifier, uint32) {
  forget(InvalidOid);
}

Remembered &remembered_for(KeyTableKind kind, Oid relid) {
  Remembered &table = remembered[static_cast<int>(kind)];
  if (table.relid == relid)
    return table;
  if (!callbacks_registered) {
    CacheRegisterRelcacheCallback(forget_on_relcache_change, (Datum)0);
    CacheRegisterSyscacheCallback(EVENTTRIGGEROID,
                                  forget_on_event_trigger_change, (Datum)0);
    callbacks_registered = true;
  }
  table.relid = relid;
  table.count = 0;
  table.marking = database_marks_roles();
  return table;
}

AttrNumber scope_column_of(Oid relid) {
  AttrNumber scope_column = get_attnum(relid, "scope");
  if (scope_column == InvalidAttrNumber)
    ereport(ERROR, (errcode(ERRCODE_UNDEFINED_COLUMN),
                    errmsg("column \"scope\" of idempotency.%s is missing",
                           get_rel_name(relid))));
  return scope_column;
}

void ensure_marked(KeyTableKind kind, Oid relid, AttrNumber scope_column,
                   Oid role) {
  Remembered &table = remembered_for(kind, relid);
  if (!table.marking || !OidIsValid(role))
    return;
  for (int i = table.count - 1; i >= 0; i--)
    if (table.roles[i] == role)
      return;
  if (scope_column == InvalidAttrNumber)
    scope_column = scope_column_of(relid);
  if (!mark_exists(relid, scope_column, role)) {
    updateAclDependencies(RelationRelationId, relid, scope_column, InvalidOid,
                          0, nullptr, 1, one_role(role));
    recorded_in_transaction = true;
  }
  if (table.count == max_remembered)
    table.count = 0;
  table.roles[table.count++] = role;
}

// Only a GRANT or REVOKE on tables changes the privileges of their columns.
bool grant_names(const GrantStmt *grant, Oid relid) {
  bool in_schema = grant->targtype == ACL_TARGET_ALL_IN_SCHEMA;
  if (grant->objtype != OBJECT_TABLE ||
      (!in_schema && grant->targtype != ACL_TARGET_OBJECT))
    return false;
  ListCell *cell;
  foreach (cell, grant->objects)
    if (in_schema ? get_namespace_oid(strVal(lfirst(cell)), true) ==
                        get_rel_namespace(relid)
                  : RangeVarGetRelid(lfirst_node(RangeVar, cell), NoLock,
                                     true) == relid)
      return true;
  return false;
}

// Under the lock a store takes, so that DROP OWNED waits. After a GRANT or
// REVOKE, which changed pg_shdepend, the remembered roles are forgotten first.
int64 mark_roles(const GrantStmt *grant) {
  int64 deleted = 0;
  for (KeyTableKind kind : key_table_kinds) {
    KeyStore store = store_of_kind(kind);
    Oid relid = store.relation();
    if (!OidIsValid(relid) || (grant != nullptr && !grant_names(grant, relid)))
      continue;
    LockRelationOid(relid, RowExclusiveLock);
    AttrNumber scope_column = scope_column_of(relid);
    role_keys::Roles roles = store.roles_with_keys(relid, scope_column);
    if (grant != nullptr)
      forget(relid);
    for (uint64 i = 0; i < roles.count; i++) {
      Oid role = roles.oids[i];
      if (!OidIsValid(role))
        continue; // keys of no role: no caller has OID 0
      if (SearchSysCacheExists1(AUTHOID, ObjectIdGetDatum(role)))
        ensure_marked(kind, relid, scope_column, role);
      else if (grant == nullptr)
        deleted += (int64)store.delete_keys_of(relid, scope_column, role);
    }
  }
  return deleted;
}

} // namespace

void ensure(Relation keys, AttrNumber scope_column, Oid role) {
  ensure_marked(KeyTableKind::local, RelationGetRelid(keys), scope_column,
                role);
}

void ensure_tenant(Oid tenant_keys, Oid role) {
  ensure_marked(KeyTableKind::tenant, tenant_keys, InvalidAttrNumber, role);
}

int64 mark_key_roles() { return mark_roles(nullptr); }

void keep_marks_after_grant(const GrantStmt *grant) { (void)mark_roles(grant); }

bool database_marks_roles() {
  return OidIsValid(get_event_trigger_oid(event_trigger_name, true));
}

void drop_owned_keys(const List *roles) {
  ListCell *cell;
  foreach (cell, roles) {
    Oid role = get_rolespec_oid(lfirst_node(RoleSpec, cell), false);
    // DROP OWNED's own check, made before anything is deleted.
    if (!has_privs_of_role(GetUserId(), role))
      ereport(ERROR, (errcode(ERRCODE_INSUFFICIENT_PRIVILEGE),
                      errmsg("permission denied to drop objects")));
  }
  for (KeyTableKind kind : key_table_kinds) {
    KeyStore store = store_of_kind(kind);
    Oid relid = store.relation();
    if (!OidIsValid(relid))
      continue;
    // Calls that may be storing keys finish first, and new ones wait until
    // DROP OWNED commits: no key of a dropped role can slip in meanwhile.
    LockRelationOid(relid, ShareRowExclusiveLock);
    // A table without its scope column holds no role's keys.
    AttrNumber scope_column = get_attnum(relid, "scope");
    if (scope_column == InvalidAttrNumber)
      continue;
    foreach (cell, roles) {
      Oid role = get_rolespec_oid(lfirst_node(RoleSpec, cell), false);
      (void)store.delete_keys_of(relid, scope_column, role);
      // As a REVOKE on the column would: there may be more than one row (a
      // GRANT on the column to a marked role adds the server's own).
      updateAclDependencies(RelationRelationId, relid, scope_column, InvalidOid,
                            1, one_role(role), 0, nullptr);
    }
    // Every backend looks its marks up again at its next store.
    CacheInvalidateRelcacheByRelid(relid);
  }
}

void at_commit() { recorded_in_transaction = false; }

void at_abort() {
  at_subtransaction_abort();
  recorded_in_transaction = false;
}

void at_subtransaction_abort() {
  if (recorded_in_transaction)
    forget(InvalidOid);
}

} // namespace idempotency::storage::role_marks

namespace idempotency::storage::role_keys {

namespace {

// The scope column may still be regrole.
const char *scope_operator_schema(Oid type) {
  return type == REGROLEOID ? "pg_catalog" : "idempotency";
}

const char *qualified_name(Oid relid) {
  return quote_qualified_identifier(
      get_namespace_name(get_rel_namespace(relid)), get_rel_name(relid));
}

Roles select_roles(const char *sql, Oid owner) {
  table_owner::Saved saved = table_owner::begin_spi(owner);
  int rc = SPI_execute(sql, true, 0);
  if (rc != SPI_OK_SELECT)
    elog(ERROR, "idempotency: listing the roles that have keys failed: %s",
         SPI_result_code_string(rc));
  Roles roles{SPI_processed, nullptr};
  roles.oids = static_cast<Oid *>(
      SPI_palloc(sizeof(Oid) * (roles.count > 0 ? roles.count : 1)));
  for (uint64 i = 0; i < roles.count; i++) {
    bool isnull;
    roles.oids[i] = DatumGetObjectId(SPI_getbinval(
        SPI_tuptable->vals[i], SPI_tuptable->tupdesc, 1, &isnull));
  }
  table_owner::finish_spi(saved);
  return roles;
}

} // namespace

Roles in_keys(Oid keys, AttrNumber scope_column) {
  return select_roles(
      psprintf("WITH RECURSIVE r (scope) AS ("
               "  (SELECT k.scope FROM idempotency.keys AS k ORDER BY k.scope "
               "LIMIT 1)"
               "  UNION ALL"
               "  SELECT (SELECT k.scope FROM idempotency.keys AS k"
               "           WHERE k.scope OPERATOR(%s.>) r.scope"
               "           ORDER BY k.scope LIMIT 1)"
               "    FROM r WHERE r.scope IS NOT NULL)"
               " SELECT r.scope FROM r WHERE r.scope IS NOT NULL",
               scope_operator_schema(get_atttype(keys, scope_column))),
      table_owner::of(keys));
}

uint64 delete_in_keys(Oid keys, AttrNumber scope_column, Oid role) {
  return delete_in(keys, table_owner::of(keys), get_atttype(keys, scope_column),
                   role);
}

Roles in_shards(List *shards, Oid owner) {
  if (shards == NIL)
    return Roles{0, nullptr};
  StringInfoData sql;
  initStringInfo(&sql);
  ListCell *cell;
  foreach (cell, shards)
    appendStringInfo(&sql, "%sSELECT k.scope FROM %s AS k",
                     sql.len > 0 ? " UNION " : "",
                     qualified_name(lfirst_oid(cell)));
  return select_roles(sql.data, owner);
}

uint64 delete_in(Oid relid, Oid owner, Oid scope_type, Oid role) {
  char *sql =
      psprintf("DELETE FROM %s AS k WHERE k.scope OPERATOR(%s.=) $1",
               qualified_name(relid), scope_operator_schema(scope_type));
  table_owner::Saved saved = table_owner::begin_spi(owner);
  Datum value = ObjectIdGetDatum(role);
  SPIPlanPtr plan = SPI_prepare(sql, 1, &scope_type);
  if (plan == nullptr)
    elog(ERROR, "idempotency: preparing the deletion of a role's keys failed");
  int rc = SPI_execute_snapshot(plan, &value, nullptr, GetLatestSnapshot(),
                                InvalidSnapshot, false, false, 0);
  if (rc != SPI_OK_DELETE)
    elog(ERROR, "idempotency: deleting a role's keys failed: %s",
         SPI_result_code_string(rc));
  uint64 deleted = SPI_processed;
  table_owner::finish_spi(saved);
  return deleted;
}

} // namespace idempotency::storage::role_keys

// idempotency.role_scope: a role's OID inside the cluster, so renaming a role
// keeps its keys, and its name in text and binary I/O (COPY, pg_dump, logical
// replication): another node's roles may have other OIDs. A dropped role is
// written "-", read back, like a number (regrole's form of one), as no role
// (OID 0, no caller's scope), never as the role that has that OID here.
namespace idempotency::storage {

namespace {

constexpr const char *no_role = "-";

// Role names are global: no search_path is involved.
Oid role_of_text(const char *scope_text) {
  if (strcmp(scope_text, no_role) == 0 ||
      (*scope_text != '\0' &&
       strspn(scope_text, "0123456789") == strlen(scope_text)))
    return InvalidOid;
  List *names = compat::stringToQualifiedNameList(scope_text, nullptr);
  if (list_length(names) != 1)
    ereport(ERROR, (errcode(ERRCODE_INVALID_NAME),
                    errmsg("invalid role name \"%s\"", scope_text),
                    errdetail("A role scope is one role name, or \"-\".")));
  return get_role_oid(strVal(linitial(names)), false);
}

const char *text_of_role(Oid role) {
  const char *name = GetUserNameFromId(role, true);
  return name == nullptr ? no_role : quote_identifier(name);
}

} // namespace

Datum role_scope_in(FunctionCallInfo fcinfo) {
  return ObjectIdGetDatum(role_of_text(PG_GETARG_CSTRING(0)));
}

Datum role_scope_out(FunctionCallInfo fcinfo) {
  PG_RETURN_CSTRING(pstrdup(text_of_role(PG_GETARG_OID(0))));
}

Datum role_scope_recv(FunctionCallInfo fcinfo) {
  StringInfo message = reinterpret_cast<StringInfo>(PG_GETARG_POINTER(0));
  int text_bytes;
  char *scope_text =
      pq_getmsgtext(message, message->len - message->cursor, &text_bytes);
  return ObjectIdGetDatum(role_of_text(scope_text));
}

Datum role_scope_send(FunctionCallInfo fcinfo) {
  const char *scope_text = text_of_role(PG_GETARG_OID(0));
  StringInfoData message;
  pq_begintypsend(&message);
  pq_sendtext(&message, scope_text, strlen(scope_text));
  PG_RETURN_BYTEA_P(pq_endtypsend(&message));
}

} // namespace idempotency::storage
