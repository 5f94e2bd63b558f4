#include "idempotency/storage/shared_dependency.hpp"

extern "C" {
#include "access/genam.h"
#include "access/htup_details.h"
#include "access/table.h"
#include "catalog/catalog.h"
#include "catalog/dependency.h"
#include "catalog/indexing.h"
#include "catalog/pg_authid.h"
#include "catalog/pg_class.h"
#include "catalog/pg_shdepend.h"
#include "miscadmin.h"
#include "storage/lmgr.h"
#include "utils/fmgroids.h"
#include "utils/rel.h"
#include "utils/syscache.h"
}

namespace idempotency::storage::shared_dependency {

namespace {

bool is_column_acl(const FormData_pg_shdepend *dependency, Oid relid,
                   AttrNumber column) {
  return dependency->dbid == MyDatabaseId &&
         dependency->classid == RelationRelationId &&
         dependency->objid == relid && dependency->objsubid == column &&
         dependency->deptype == SHARED_DEPENDENCY_ACL;
}

// Visits the pg_shdepend rows that reference `role` (the index on the
// referenced object) which are its ACL dependency of `relid`'s `column`;
// deletes them when `remove`. Returns how many there were.
int scan(Oid relid, AttrNumber column, Oid role, bool remove) {
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
    if (!is_column_acl(reinterpret_cast<Form_pg_shdepend>(GETSTRUCT(tuple)),
                       relid, column))
      continue;
    found++;
    if (remove)
      CatalogTupleDelete(shdepend, &tuple->t_self);
  }
  systable_endscan(scan);
  table_close(shdepend, NoLock);
  return found;
}

} // namespace

bool exists(Oid relid, AttrNumber column, Oid role) {
  return scan(relid, column, role, false) > 0;
}

bool record(Oid relid, AttrNumber column, Oid role) {
  if (IsPinnedObject(AuthIdRelationId, role))
    return false;
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
  values[Anum_pg_shdepend_objsubid - 1] = Int32GetDatum(column);
  values[Anum_pg_shdepend_refclassid - 1] = ObjectIdGetDatum(AuthIdRelationId);
  values[Anum_pg_shdepend_refobjid - 1] = ObjectIdGetDatum(role);
  values[Anum_pg_shdepend_deptype - 1] = CharGetDatum(SHARED_DEPENDENCY_ACL);
  HeapTuple tuple = heap_form_tuple(RelationGetDescr(shdepend), values, nulls);
  CatalogTupleInsert(shdepend, tuple);
  heap_freetuple(tuple);
  table_close(shdepend, RowExclusiveLock);
  return true;
}

int remove(Oid relid, AttrNumber column, Oid role) {
  return scan(relid, column, role, true);
}

} // namespace idempotency::storage::shared_dependency
