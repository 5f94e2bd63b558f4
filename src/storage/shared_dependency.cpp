#include "idempotency/storage/shared_dependency.hpp"

extern "C" {
#include "access/genam.h"
#include "access/htup_details.h"
#include "access/table.h"
#include "catalog/dependency.h"
#include "catalog/pg_authid.h"
#include "catalog/pg_class.h"
#include "catalog/pg_shdepend.h"
#include "miscadmin.h"
#include "utils/fmgroids.h"
#include "utils/rel.h"
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

} // namespace

bool exists(Oid relid, AttrNumber column, Oid role) {
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
  while (!found && (tuple = systable_getnext(scan)) != nullptr)
    found = is_column_acl(reinterpret_cast<Form_pg_shdepend>(GETSTRUCT(tuple)),
                          relid, column);
  systable_endscan(scan);
  table_close(shdepend, NoLock);
  return found;
}

namespace {

// updateAclDependencies() takes sorted, de-duplicated palloc'd arrays of
// the roles in a privilege list before and after a change, and pfrees them.
Oid *one_role(Oid role) {
  Oid *roles = static_cast<Oid *>(palloc(sizeof(Oid)));
  roles[0] = role;
  return roles;
}

} // namespace

// No owner is passed (InvalidOid): the server leaves the owner's row out,
// since the owner's own dependency keeps it, but the key table's owner may
// change while a role keeps its keys.
void record(Oid relid, AttrNumber column, Oid role) {
  updateAclDependencies(RelationRelationId, relid, column, InvalidOid, 0,
                        nullptr, 1, one_role(role));
}

void remove(Oid relid, AttrNumber column, Oid role) {
  updateAclDependencies(RelationRelationId, relid, column, InvalidOid, 1,
                        one_role(role), 0, nullptr);
}

} // namespace idempotency::storage::shared_dependency
