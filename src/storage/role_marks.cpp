// The marks that keep a role with keys from being dropped (see
// role_marks.hpp): looked up and recorded in pg_shdepend, remembered per
// backend, removed by DROP OWNED through the extension's event trigger.
#include <type_traits>

#include "idempotency/storage/role_marks.hpp"

#include "idempotency/storage/citus.hpp"

#include "idempotency/compat.hpp"

extern "C" {
#include "access/genam.h"
#include "access/htup_details.h"
#include "access/table.h"
#include "access/xact.h"
#include "catalog/catalog.h"
#include "catalog/dependency.h"
#include "catalog/indexing.h"
#include "catalog/namespace.h"
#include "catalog/pg_authid.h"
#include "catalog/pg_class.h"
#include "catalog/pg_shdepend.h"
#include "commands/event_trigger.h"
#include "executor/spi.h"
#include "miscadmin.h"
#include "storage/lmgr.h"
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

// The roles this backend knows to be marked on a key table: one set for
// idempotency.keys, one for idempotency.tenant_keys (on Citus). A backend
// serving more roles than this starts over, looking them up again.
constexpr int max_remembered = 1024;
constexpr int remembered_tables = 2;

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

Remembered remembered[remembered_tables];
int next_taken;
bool callbacks_registered;

void forget_all(Remembered &table) {
  table.relid = InvalidOid;
  table.count = 0;
}

// DROP OWNED, ALTER EXTENSION UPDATE and any change to a table's
// definition invalidate its relcache entry: each backend then looks its
// marks up again at its next store.
void forget_on_relcache_change(Datum, Oid relid) {
  for (Remembered &table : remembered)
    if (relid == InvalidOid || relid == table.relid)
      forget_all(table);
}

void forget_unless_committed(XactEvent event, void *) {
  for (Remembered &table : remembered) {
    switch (event) {
    case XACT_EVENT_COMMIT:
    case XACT_EVENT_PARALLEL_COMMIT:
      table.recorded_in_transaction = false;
      break;
    case XACT_EVENT_ABORT:
    case XACT_EVENT_PARALLEL_ABORT:
    case XACT_EVENT_PREPARE: // ROLLBACK PREPARED may still take the mark
      if (table.recorded_in_transaction)
        forget_all(table);
      table.recorded_in_transaction = false;
      break;
    default:
      break;
    }
  }
}

void forget_on_subtransaction_abort(SubXactEvent event, SubTransactionId,
                                    SubTransactionId, void *) {
  if (event != SUBXACT_EVENT_ABORT_SUB)
    return;
  for (Remembered &table : remembered)
    if (table.recorded_in_transaction)
      forget_all(table);
}

// Whether a database marks roles is known by its event trigger: the update
// to 0.7 creating it (or DROP EXTENSION dropping it) makes every backend
// look again, also for idempotency.tenant_keys, whose definition the update
// does not change.
void forget_on_event_trigger_change(Datum, compat::SysCacheIdentifier, uint32) {
  for (Remembered &table : remembered)
    forget_all(table);
}

void register_callbacks_once() {
  if (callbacks_registered)
    return;
  CacheRegisterRelcacheCallback(forget_on_relcache_change, (Datum)0);
  CacheRegisterSyscacheCallback(EVENTTRIGGEROID, forget_on_event_trigger_change,
                                (Datum)0);
  RegisterXactCallback(forget_unless_committed, nullptr);
  RegisterSubXactCallback(forget_on_subtransaction_abort, nullptr);
  callbacks_registered = true;
}

bool has_event_trigger() {
  return OidIsValid(get_event_trigger_oid(event_trigger_name, true));
}

// What this backend remembers of `relid`: an empty set the first time, or
// once forgotten (in a free slot, else the other table's).
Remembered &remembered_for(Oid relid) {
  Remembered *free = nullptr;
  for (Remembered &table : remembered) {
    if (table.relid == relid)
      return table;
    if (free == nullptr && !OidIsValid(table.relid))
      free = &table;
  }
  if (free == nullptr) {
    free = &remembered[next_taken];
    next_taken = (next_taken + 1) % remembered_tables;
  }
  register_callbacks_once();
  free->relid = relid;
  free->count = 0;
  free->recorded_in_transaction = false;
  free->marking = has_event_trigger();
  return *free;
}

bool is_remembered(const Remembered &table, Oid role) {
  for (int i = table.count - 1; i >= 0; i--)
    if (table.roles[i] == role)
      return true;
  return false;
}

void remember(Remembered &table, Oid role) {
  if (table.count == max_remembered)
    table.count = 0;
  table.roles[table.count++] = role;
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

// Writes the mark's pg_shdepend row as recordSharedDependencyOn writes its
// rows, which it does only for whole objects (an assert-enabled server
// stops on a column): nothing for the bootstrap superuser, which can never
// be dropped; otherwise the role locked against a concurrent DROP ROLE
// until this transaction ends, 42704 if it is gone, then the row.
void insert_mark(Oid relid, AttrNumber scope_column, Oid role) {
  if (IsPinnedObject(AuthIdRelationId, role))
    return;
  LockSharedObject(AuthIdRelationId, role, 0, AccessShareLock);
  if (!SearchSysCacheExists1(AUTHOID, ObjectIdGetDatum(role)))
    ereport(ERROR, (errcode(ERRCODE_UNDEFINED_OBJECT),
                    errmsg("role %u was concurrently dropped", role)));
  Relation shdepend = table_open(SharedDependRelationId, RowExclusiveLock);
  Datum values[Natts_pg_shdepend];
  bool nulls[Natts_pg_shdepend] = {};
  values[Anum_pg_shdepend_dbid - 1] = ObjectIdGetDatum(MyDatabaseId);
  values[Anum_pg_shdepend_classid - 1] = ObjectIdGetDatum(RelationRelationId);
  values[Anum_pg_shdepend_objid - 1] = ObjectIdGetDatum(relid);
  values[Anum_pg_shdepend_objsubid - 1] = Int32GetDatum(scope_column);
  values[Anum_pg_shdepend_refclassid - 1] = ObjectIdGetDatum(AuthIdRelationId);
  values[Anum_pg_shdepend_refobjid - 1] = ObjectIdGetDatum(role);
  values[Anum_pg_shdepend_deptype - 1] = CharGetDatum(SHARED_DEPENDENCY_ACL);
  HeapTuple tuple = heap_form_tuple(RelationGetDescr(shdepend), values, nulls);
  CatalogTupleInsert(shdepend, tuple);
  heap_freetuple(tuple);
  table_close(shdepend, RowExclusiveLock);
}

// Records the mark unless it exists.
void mark(Remembered &table, AttrNumber scope_column, Oid role) {
  if (scan_marks(table.relid, scope_column, role, false) > 0)
    return;
  insert_mark(table.relid, scope_column, role);
  table.recorded_in_transaction = true;
}

// The scope column of a key table; 42703 when it is missing.
AttrNumber scope_column_of(Oid relid) {
  AttrNumber scope_column = get_attnum(relid, "scope");
  if (scope_column == InvalidAttrNumber)
    ereport(ERROR, (errcode(ERRCODE_UNDEFINED_COLUMN),
                    errmsg("column \"scope\" of idempotency.%s is missing",
                           get_rel_name(relid))));
  return scope_column;
}

// `scope_column` InvalidAttrNumber: looked up, only when the role is not
// remembered (a call pays the comparison alone).
void ensure_marked(Oid relid, AttrNumber scope_column, Oid role) {
  Remembered &table = remembered_for(relid);
  if (!table.marking || !OidIsValid(role) || is_remembered(table, role))
    return;
  if (scope_column == InvalidAttrNumber)
    scope_column = scope_column_of(relid);
  mark(table, scope_column, role);
  remember(table, role);
}

Oid table_in_schema(const char *name) {
  Oid schema = get_namespace_oid("idempotency", true);
  return OidIsValid(schema) ? get_relname_relid(name, schema) : InvalidOid;
}

Oid key_table_oid() { return table_in_schema("keys"); }

// idempotency.tenant_keys, where Citus distributes it; InvalidOid
// elsewhere. On every node it is the table's local relation (the
// coordinator's table, a worker's shell), whose rows are in the shards.
Oid tenant_table_oid() {
  Oid relid = table_in_schema("tenant_keys");
  if (!OidIsValid(relid) ||
      citus::table_kind(relid) != citus::TableKind::distributed)
    return InvalidOid;
  return relid;
}

// Statements on the key table run through SPI as its owner: callers, and
// the role running DROP OWNED, have no rights on it, and row-level security
// would hide other roles' rows. Every name is schema-qualified.
struct OwnerSpi {
  Oid saved_user;
  int saved_context;
};
static_assert(std::is_trivially_destructible_v<OwnerSpi>);

OwnerSpi begin_as_owner(Oid owner) {
  OwnerSpi spi;
  GetUserIdAndSecContext(&spi.saved_user, &spi.saved_context);
  SetUserIdAndSecContext(owner,
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

// Tenant keys. Each node holds the rows of the shards placed on it, under
// the OIDs its own roles have there (roles do not have the same OID on
// every node): a node marks the roles of the rows written on it, on its own
// relation of idempotency.tenant_keys, and DROP OWNED, which Citus runs on
// every node, deletes the rows of the node it runs on. A statement through
// Citus would compare scopes with the coordinator's OIDs on every shard.

struct ShardRelations {
  int count;
  Oid *relids;
};
static_assert(std::is_trivially_destructible_v<ShardRelations>);

// The relations on this node of the shards of idempotency.tenant_keys:
// those placed here, and those of a shard Citus is moving here or moved
// away and has not dropped yet, whose rows are on this node too. Read
// inside OwnerSpi.
ShardRelations local_shards() {
  int rc = SPI_execute(
      "SELECT r.shard FROM (SELECT pg_catalog.to_regclass("
      "   pg_catalog.shard_name(s.logicalrelid, s.shardid))::pg_catalog.oid"
      "   AS shard FROM pg_catalog.pg_dist_shard AS s"
      "  WHERE s.logicalrelid OPERATOR(pg_catalog.=)"
      "    'idempotency.tenant_keys'::pg_catalog.regclass) AS r"
      " WHERE r.shard IS NOT NULL",
      true, 0);
  if (rc != SPI_OK_SELECT)
    elog(ERROR, "idempotency: listing the shards of tenant keys failed: %s",
         SPI_result_code_string(rc));
  ShardRelations shards{static_cast<int>(SPI_processed), nullptr};
  shards.relids = static_cast<Oid *>(
      SPI_palloc(sizeof(Oid) * (shards.count > 0 ? shards.count : 1)));
  for (int i = 0; i < shards.count; i++) {
    bool isnull;
    shards.relids[i] = DatumGetObjectId(SPI_getbinval(
        SPI_tuptable->vals[i], SPI_tuptable->tupdesc, 1, &isnull));
  }
  return shards;
}

Oid relation_owner(Oid relid) {
  HeapTuple tuple = SearchSysCache1(RELOID, ObjectIdGetDatum(relid));
  if (!HeapTupleIsValid(tuple))
    elog(ERROR, "cache lookup failed for relation %u", relid);
  Oid owner = reinterpret_cast<Form_pg_class>(GETSTRUCT(tuple))->relowner;
  ReleaseSysCache(tuple);
  return owner;
}

const char *qualified_name(Oid relid) {
  return quote_qualified_identifier(
      get_namespace_name(get_rel_namespace(relid)), get_rel_name(relid));
}

// Deletes the rows of `role` in one shard relation, with a snapshot taken
// now (as delete_keys_of). Inside OwnerSpi.
uint64 delete_tenant_keys_of(Oid shard, Oid scope_type, Oid role) {
  char *sql = psprintf("DELETE FROM %s AS k WHERE k.scope "
                       "OPERATOR(idempotency.=) $1",
                       qualified_name(shard));
  Datum value = ObjectIdGetDatum(role);
  SPIPlanPtr plan = SPI_prepare(sql, 1, &scope_type);
  if (plan == nullptr)
    elog(ERROR,
         "idempotency: preparing the deletion of a role's tenant keys failed");
  int rc = SPI_execute_snapshot(plan, &value, nullptr, GetLatestSnapshot(),
                                InvalidSnapshot, false, false, 0);
  if (rc != SPI_OK_DELETE)
    elog(ERROR, "idempotency: deleting a role's tenant keys failed: %s",
         SPI_result_code_string(rc));
  SPI_freeplan(plan);
  return SPI_processed;
}

Oid scope_type_of(Oid relid, AttrNumber scope_column) {
  return get_atttype(relid, scope_column);
}

// The roles in the first column of `roles` (a SELECT DISTINCT of scope):
// each that exists is marked on `relid`; each that is gone has its keys
// deleted by `delete_keys_of_role`, since no role may ever reach them
// again. Returns the number of keys deleted.
template <typename DeleteKeys>
int64 settle_roles(const SPITupleTable *roles, uint64 count, Oid relid,
                   AttrNumber scope_column, DeleteKeys delete_keys_of_role) {
  int64 deleted = 0;
  for (uint64 i = 0; i < count; i++) {
    bool isnull;
    Oid role = DatumGetObjectId(
        SPI_getbinval(roles->vals[i], roles->tupdesc, 1, &isnull));
    if (!OidIsValid(role))
      continue; // keys of no role: no caller has OID 0
    if (SearchSysCacheExists1(AUTHOID, ObjectIdGetDatum(role)))
      ensure_marked(relid, scope_column, role);
    else
      deleted += delete_keys_of_role(role);
  }
  return deleted;
}

// mark_key_roles() for the tenant keys of this node.
int64 mark_tenant_key_roles() {
  Oid relid = tenant_table_oid();
  if (!OidIsValid(relid))
    return 0;
  // As a store does: DROP OWNED on this node waits for the marks made here.
  LockRelationOid(relid, RowExclusiveLock);
  AttrNumber scope_column = scope_column_of(relid);
  Oid scope_type = scope_type_of(relid, scope_column);
  int64 deleted = 0;
  OwnerSpi spi = begin_as_owner(relation_owner(relid));
  ShardRelations shards = local_shards();
  for (int s = 0; s < shards.count; s++) {
    // No index starts with the scope here (the tenant comes first): the
    // shard is read in full, once a round of the node's expiry worker.
    char *sql = psprintf("SELECT DISTINCT k.scope FROM %s AS k",
                         qualified_name(shards.relids[s]));
    if (SPI_execute(sql, true, 0) != SPI_OK_SELECT)
      elog(ERROR,
           "idempotency: listing the roles that have tenant keys failed");
    Oid shard = shards.relids[s];
    deleted +=
        settle_roles(SPI_tuptable, SPI_processed, relid, scope_column,
                     [shard, scope_type](Oid role) {
                       return delete_tenant_keys_of(shard, scope_type, role);
                     });
  }
  finish(spi);
  return deleted;
}

// DROP OWNED for the tenant keys of this node: the rows of `role` in the
// shards here, and its mark. The caller holds `relid` in SHARE ROW
// EXCLUSIVE mode.
void drop_owned_tenant_keys(Oid relid, Oid role) {
  AttrNumber scope_column = scope_column_of(relid);
  OwnerSpi spi = begin_as_owner(relation_owner(relid));
  ShardRelations shards = local_shards();
  for (int s = 0; s < shards.count; s++)
    (void)delete_tenant_keys_of(shards.relids[s],
                                scope_type_of(relid, scope_column), role);
  finish(spi);
  (void)scan_marks(relid, scope_column, role, true);
}

} // namespace

void ensure(Relation keys, AttrNumber scope_column, Oid role) {
  ensure_marked(RelationGetRelid(keys), scope_column, role);
}

void ensure_tenant(Oid tenant_keys, Oid role) {
  ensure_marked(tenant_keys, InvalidAttrNumber, role);
}

namespace {

int64 mark_local_key_roles() {
  Oid relid = key_table_oid();
  if (!OidIsValid(relid))
    return 0;
  Relation keys = table_open(relid, RowExclusiveLock);
  AttrNumber scope_column = scope_column_of(relid);
  OwnerSpi spi = begin_as_owner(keys->rd_rel->relowner);
  SPITupleTable *roles = roles_with_keys(keys, scope_column);
  int64 deleted = settle_roles(roles, roles->numvals, relid, scope_column,
                               [keys, scope_column](Oid role) {
                                 return static_cast<int64>(
                                     delete_keys_of(keys, scope_column, role));
                               });
  finish(spi);
  table_close(keys, NoLock);
  return deleted;
}

// DROP OWNED's own check, made before anything is deleted.
void check_may_drop_owned(Oid role) {
  if (!has_privs_of_role(GetUserId(), role))
    ereport(ERROR, (errcode(ERRCODE_INSUFFICIENT_PRIVILEGE),
                    errmsg("permission denied to drop objects")));
}

} // namespace

int64 mark_key_roles() {
  int64 deleted = mark_local_key_roles();
  return deleted + mark_tenant_key_roles();
}

bool database_marks_roles() { return has_event_trigger(); }

void drop_owned_keys(const List *roles) {
  Oid relid = key_table_oid();
  Oid tenant_relid = tenant_table_oid();
  // Calls that may be storing keys finish first, and new ones wait until
  // DROP OWNED commits: no key of a dropped role can slip in meanwhile.
  Relation keys =
      OidIsValid(relid) ? table_open(relid, ShareRowExclusiveLock) : nullptr;
  if (OidIsValid(tenant_relid))
    LockRelationOid(tenant_relid, ShareRowExclusiveLock);
  AttrNumber scope_column =
      keys != nullptr ? get_attnum(relid, "scope") : InvalidAttrNumber;
  ListCell *cell;
  foreach (cell, roles) {
    Oid role = get_rolespec_oid(lfirst_node(RoleSpec, cell), false);
    check_may_drop_owned(role);
    if (scope_column != InvalidAttrNumber) {
      OwnerSpi spi = begin_as_owner(keys->rd_rel->relowner);
      (void)delete_keys_of(keys, scope_column, role);
      finish(spi);
      (void)scan_marks(relid, scope_column, role, true);
    }
    if (OidIsValid(tenant_relid))
      drop_owned_tenant_keys(tenant_relid, role);
  }
  // Every backend looks its marks up again at its next store.
  if (keys != nullptr) {
    CacheInvalidateRelcache(keys);
    table_close(keys, NoLock);
  }
  if (OidIsValid(tenant_relid))
    CacheInvalidateRelcacheByRelid(tenant_relid);
}

} // namespace idempotency::storage::role_marks
