// The marks that keep a role with keys from being dropped (see
// role_marks.hpp): looked up and recorded in pg_shdepend, remembered per
// backend, removed by DROP OWNED through the extension's event trigger.
#include <type_traits>

#include "idempotency/storage/role_marks.hpp"

extern "C" {
#include "access/genam.h"
#include "access/htup_details.h"
#include "access/table.h"
#include "access/xact.h"
#include "catalog/dependency.h"
#include "catalog/indexing.h"
#include "catalog/namespace.h"
#include "catalog/pg_authid.h"
#include "catalog/pg_class.h"
#include "catalog/pg_shdepend.h"
#include "commands/event_trigger.h"
#include "executor/spi.h"
#include "miscadmin.h"
#include "utils/acl.h"
#include "utils/builtins.h"
#include "utils/fmgroids.h"
#include "utils/inval.h"
#include "utils/lsyscache.h"
#include "utils/rel.h"
#include "utils/snapmgr.h"
#include "utils/syscache.h"
}

namespace idempotency::storage::role_marks {

namespace {

constexpr const char *event_trigger_name = "idempotency_drop_owned_keys";

// The roles this backend knows to be marked on one key table. A backend
// serving more roles than this starts over, looking them up again.
constexpr int max_remembered = 1024;

struct Remembered {
  Oid relid;    // the key table; InvalidOid: nothing known
  bool marking; // whether its database has the event trigger (0.7 on)
  // A mark recorded by the open transaction: remembered roles are
  // forgotten if it does not commit, since the mark goes with it.
  bool recorded_in_transaction;
  int count;
  Oid roles[max_remembered];
};
static_assert(std::is_trivially_destructible_v<Remembered>);

Remembered remembered;
bool callbacks_registered;

void forget_all() {
  remembered.relid = InvalidOid;
  remembered.count = 0;
}

// DROP OWNED, ALTER EXTENSION UPDATE and any change to the table's
// definition invalidate its relcache entry: each backend then looks its
// marks up again at its next store.
void forget_on_relcache_change(Datum, Oid relid) {
  if (relid == InvalidOid || relid == remembered.relid)
    forget_all();
}

void forget_unless_committed(XactEvent event, void *) {
  switch (event) {
  case XACT_EVENT_COMMIT:
  case XACT_EVENT_PARALLEL_COMMIT:
    remembered.recorded_in_transaction = false;
    break;
  case XACT_EVENT_ABORT:
  case XACT_EVENT_PARALLEL_ABORT:
  case XACT_EVENT_PREPARE: // ROLLBACK PREPARED may still take the mark
    if (remembered.recorded_in_transaction)
      forget_all();
    remembered.recorded_in_transaction = false;
    break;
  default:
    break;
  }
}

void forget_on_subtransaction_abort(SubXactEvent event, SubTransactionId,
                                    SubTransactionId, void *) {
  if (event == SUBXACT_EVENT_ABORT_SUB && remembered.recorded_in_transaction)
    forget_all();
}

void register_callbacks_once() {
  if (callbacks_registered)
    return;
  CacheRegisterRelcacheCallback(forget_on_relcache_change, (Datum)0);
  RegisterXactCallback(forget_unless_committed, nullptr);
  RegisterSubXactCallback(forget_on_subtransaction_abort, nullptr);
  callbacks_registered = true;
}

bool has_event_trigger() {
  return OidIsValid(get_event_trigger_oid(event_trigger_name, true));
}

void start_remembering(Oid relid) {
  register_callbacks_once();
  remembered.relid = relid;
  remembered.count = 0;
  remembered.marking = has_event_trigger();
}

bool is_remembered(Oid role) {
  for (int i = remembered.count - 1; i >= 0; i--)
    if (remembered.roles[i] == role)
      return true;
  return false;
}

void remember(Oid role) {
  if (remembered.count == max_remembered)
    remembered.count = 0;
  remembered.roles[remembered.count++] = role;
}

bool is_mark(const FormData_pg_shdepend *dependency, Oid relid,
             AttrNumber scope_column) {
  return dependency->dbid == MyDatabaseId &&
         dependency->classid == RelationRelationId &&
         dependency->objid == relid && dependency->objsubid == scope_column &&
         dependency->deptype == SHARED_DEPENDENCY_ACL;
}

// Visits the pg_shdepend rows that reference `role` (the index on the
// referenced object: a role has few) which are its mark on `relid`;
// deletes them when `remove`. Returns how many there were.
int scan_marks(Oid relid, AttrNumber scope_column, Oid role, bool remove) {
  Relation shdepend = table_open(SharedDependRelationId,
                                 remove ? RowExclusiveLock : AccessShareLock);
  ScanKeyData keys[2];
  ScanKeyInit(&keys[0], Anum_pg_shdepend_refclassid, BTEqualStrategyNumber,
              F_OIDEQ, ObjectIdGetDatum(AuthIdRelationId));
  ScanKeyInit(&keys[1], Anum_pg_shdepend_refobjid, BTEqualStrategyNumber,
              F_OIDEQ, ObjectIdGetDatum(role));
  SysScanDesc scan = systable_beginscan(shdepend, SharedDependReferenceIndexId,
                                        true, nullptr, 2, keys);
  int found = 0;
  HeapTuple tuple;
  while ((tuple = systable_getnext(scan)) != nullptr) {
    if (!is_mark(reinterpret_cast<Form_pg_shdepend>(GETSTRUCT(tuple)), relid,
                 scope_column))
      continue;
    found++;
    if (remove)
      CatalogTupleDelete(shdepend, &tuple->t_self);
  }
  systable_endscan(scan);
  table_close(shdepend, NoLock);
  return found;
}

// Records the mark unless it exists. recordSharedDependencyOn locks the
// role against a concurrent DROP ROLE until this transaction ends (and
// raises 42704 if it is gone), and records nothing for the bootstrap
// superuser, which can never be dropped.
void mark(Oid relid, AttrNumber scope_column, Oid role) {
  if (scan_marks(relid, scope_column, role, false) > 0)
    return;
  ObjectAddress keys_scope{RelationRelationId, relid, scope_column};
  ObjectAddress owner{AuthIdRelationId, role, 0};
  recordSharedDependencyOn(&keys_scope, &owner, SHARED_DEPENDENCY_ACL);
  remembered.recorded_in_transaction = true;
}

Oid key_table_oid() {
  Oid schema = get_namespace_oid("idempotency", true);
  return OidIsValid(schema) ? get_relname_relid("keys", schema) : InvalidOid;
}

// Statements on the key table run through SPI as its owner: callers, and
// the role running DROP OWNED, have no rights on it, and row-level security
// would hide other roles' rows. Every name is schema-qualified.
struct OwnerSpi {
  Oid saved_user;
  int saved_context;
};
static_assert(std::is_trivially_destructible_v<OwnerSpi>);

OwnerSpi begin_as_owner(Relation keys) {
  OwnerSpi spi;
  GetUserIdAndSecContext(&spi.saved_user, &spi.saved_context);
  SetUserIdAndSecContext(keys->rd_rel->relowner,
                         spi.saved_context | SECURITY_LOCAL_USERID_CHANGE);
  if (SPI_connect() != SPI_OK_CONNECT)
    elog(ERROR, "SPI_connect failed");
  return spi;
}

// Not a destructor: on an error, the (sub)transaction's abort restores the
// user and closes SPI.
void finish(const OwnerSpi &spi) {
  SPI_finish();
  SetUserIdAndSecContext(spi.saved_user, spi.saved_context);
}

// The schema of the operators that compare the scope column: the
// extension's role type, or regrole (which the column may still be).
const char *scope_operator_schema(Relation keys, AttrNumber scope_column) {
  Oid type = TupleDescAttr(RelationGetDescr(keys), scope_column - 1)->atttypid;
  return type == REGROLEOID ? "pg_catalog" : "idempotency";
}

// Deletes the keys of `role` with a snapshot taken now: keys that
// transactions committed while DROP OWNED waited for the table's lock go
// too, even when DROP OWNED runs under REPEATABLE READ.
uint64 delete_keys_of(Relation keys, AttrNumber scope_column, Oid role) {
  char *sql = psprintf("DELETE FROM idempotency.keys AS k WHERE k.scope "
                       "OPERATOR(%s.=) $1",
                       scope_operator_schema(keys, scope_column));
  Oid type = TupleDescAttr(RelationGetDescr(keys), scope_column - 1)->atttypid;
  Datum value = ObjectIdGetDatum(role);
  SPIPlanPtr plan = SPI_prepare(sql, 1, &type);
  if (plan == nullptr)
    elog(ERROR, "idempotency: preparing the deletion of a role's keys failed");
  int rc = SPI_execute_snapshot(plan, &value, nullptr, GetLatestSnapshot(),
                                InvalidSnapshot, false, false, 0);
  if (rc != SPI_OK_DELETE)
    elog(ERROR, "idempotency: deleting a role's keys failed: %s",
         SPI_result_code_string(rc));
  return SPI_processed;
}

// The roles that have keys in the table, read through the primary key
// (scope first) one role at a time, so that the cost grows with the number
// of roles, not of keys.
SPITupleTable *roles_with_keys(Relation keys, AttrNumber scope_column) {
  char *sql = psprintf(
      "WITH RECURSIVE r (scope) AS ("
      "  (SELECT k.scope FROM idempotency.keys AS k ORDER BY k.scope LIMIT 1)"
      "  UNION ALL"
      "  SELECT (SELECT k.scope FROM idempotency.keys AS k"
      "           WHERE k.scope OPERATOR(%s.>) r.scope"
      "           ORDER BY k.scope LIMIT 1)"
      "    FROM r WHERE r.scope IS NOT NULL)"
      " SELECT r.scope FROM r WHERE r.scope IS NOT NULL",
      scope_operator_schema(keys, scope_column));
  int rc = SPI_execute(sql, true, 0);
  if (rc != SPI_OK_SELECT)
    elog(ERROR, "idempotency: listing the roles that have keys failed: %s",
         SPI_result_code_string(rc));
  return SPI_tuptable;
}

} // namespace

void ensure(Relation keys, AttrNumber scope_column, Oid role) {
  Oid relid = RelationGetRelid(keys);
  if (remembered.relid != relid)
    start_remembering(relid);
  if (!remembered.marking || !OidIsValid(role) || is_remembered(role))
    return;
  mark(relid, scope_column, role);
  remember(role);
}

int64 mark_key_roles() {
  Oid relid = key_table_oid();
  if (!OidIsValid(relid))
    return 0;
  Relation keys = table_open(relid, RowExclusiveLock);
  AttrNumber scope_column = get_attnum(relid, "scope");
  if (scope_column == InvalidAttrNumber)
    ereport(ERROR, (errcode(ERRCODE_UNDEFINED_COLUMN),
                    errmsg("column \"scope\" of idempotency.keys is missing")));
  int64 deleted = 0;
  OwnerSpi spi = begin_as_owner(keys);
  SPITupleTable *roles = roles_with_keys(keys, scope_column);
  for (uint64 i = 0; i < roles->numvals; i++) {
    bool isnull;
    Oid role = DatumGetObjectId(
        SPI_getbinval(roles->vals[i], roles->tupdesc, 1, &isnull));
    if (!OidIsValid(role))
      continue; // keys of no role: no caller has OID 0
    if (SearchSysCacheExists1(AUTHOID, ObjectIdGetDatum(role)))
      ensure(keys, scope_column, role);
    else
      deleted += delete_keys_of(keys, scope_column, role);
  }
  finish(spi);
  table_close(keys, NoLock);
  return deleted;
}

bool database_marks_roles() { return has_event_trigger(); }

void drop_owned_keys(const List *roles) {
  Oid relid = key_table_oid();
  if (!OidIsValid(relid))
    return;
  // Calls that may be storing keys finish first, and new ones wait until
  // DROP OWNED commits: no key of a dropped role can slip in meanwhile.
  Relation keys = table_open(relid, ShareRowExclusiveLock);
  AttrNumber scope_column = get_attnum(relid, "scope");
  ListCell *cell;
  foreach (cell, roles) {
    Oid role = get_rolespec_oid(lfirst_node(RoleSpec, cell), false);
    // DROP OWNED's own check, made before anything is deleted.
    if (!has_privs_of_role(GetUserId(), role))
      ereport(ERROR, (errcode(ERRCODE_INSUFFICIENT_PRIVILEGE),
                      errmsg("permission denied to drop objects")));
    if (scope_column == InvalidAttrNumber)
      continue;
    OwnerSpi spi = begin_as_owner(keys);
    (void)delete_keys_of(keys, scope_column, role);
    finish(spi);
    (void)scan_marks(relid, scope_column, role, true);
  }
  // Every backend looks its marks up again at its next store.
  CacheInvalidateRelcache(keys);
  table_close(keys, NoLock);
}

} // namespace idempotency::storage::role_marks
