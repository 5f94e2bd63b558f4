// The marks that keep a role with keys from being dropped (see
// role_marks.hpp): when a role is marked, remembered per backend; which
// roles to mark, and what DROP OWNED deletes. The rows themselves are
// storage/shared_dependency's, the statements on the key tables
// storage/role_keys's, Citus's shards storage/citus's.
#include "idempotency/storage/role_marks.hpp"

#include "idempotency/storage/key_store.hpp"
#include "idempotency/storage/shared_dependency.hpp"
#include "idempotency/storage/table_owner.hpp"

#include "idempotency/compat.hpp"

extern "C" {
#include "access/table.h"
#include "catalog/namespace.h"
#include "nodes/parsenodes.h"
#include "commands/event_trigger.h"
#include "miscadmin.h"
#include "storage/lmgr.h"
#include "utils/acl.h"
#include "utils/inval.h"
#include "utils/lsyscache.h"
#include "utils/rel.h"
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
  int count;
  Oid roles[max_remembered];
};
static_assert(std::is_trivially_destructible_v<Remembered>);

Remembered remembered[remembered_tables];
int next_taken;
bool callbacks_registered;
// A mark recorded by the open transaction: every remembered role is
// forgotten if it does not commit, since the mark goes with it. One flag
// for the transaction, not one per table: a table forgotten and looked up
// again in the transaction (after a GRANT, say) finds the uncommitted mark
// and remembers it too.
bool recorded_in_transaction;

void forget_all(Remembered &table) {
  table.relid = InvalidOid;
  table.count = 0;
}

void forget_table(Oid relid) {
  for (Remembered &table : remembered)
    if (table.relid == relid)
      forget_all(table);
}

// DROP OWNED, ALTER EXTENSION UPDATE and any change to a table's
// definition invalidate its relcache entry: each backend then looks its
// marks up again at its next store.
void forget_on_relcache_change(Datum, Oid relid) {
  for (Remembered &table : remembered)
    if (relid == InvalidOid || relid == table.relid)
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

// Records the mark unless it exists.
void mark(Remembered &table, AttrNumber scope_column, Oid role) {
  if (shared_dependency::exists(table.relid, scope_column, role))
    return;
  shared_dependency::record(table.relid, scope_column, role);
  recorded_in_transaction = true;
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

// What a pass over the roles that have keys does besides marking them.
enum class GoneRoles {
  // mark_key_roles(): the keys of a role that no longer exists are
  // deleted, since no role may ever reach them again.
  delete_keys,
  // After a GRANT or REVOKE: they are left to mark_key_roles() (the expiry
  // worker's next round); the statement only records marks again. The
  // backend's remembered roles of the table are forgotten first: each
  // role's mark is looked up in pg_shdepend, which the statement changed.
  leave_keys,
};

// The roles of `roles` (those that have keys in a table): each that exists
// is marked on `relid`; each that is gone has its keys deleted by
// `delete_keys_of_role` (GoneRoles::delete_keys). Returns the number of
// keys deleted.
template <typename DeleteKeys>
int64 settle_roles(const role_keys::Roles &roles, Oid relid,
                   AttrNumber scope_column, GoneRoles gone,
                   DeleteKeys delete_keys_of_role) {
  if (gone == GoneRoles::leave_keys)
    forget_table(relid);
  int64 deleted = 0;
  for (uint64 i = 0; i < roles.count; i++) {
    Oid role = roles.oids[i];
    if (!OidIsValid(role))
      continue; // keys of no role: no caller has OID 0
    if (SearchSysCacheExists1(AUTHOID, ObjectIdGetDatum(role)))
      ensure_marked(relid, scope_column, role);
    else if (gone == GoneRoles::delete_keys)
      deleted += delete_keys_of_role(role);
  }
  return deleted;
}

// mark_key_roles() for the key table `relid` of `store`: each role that
// has keys in it (on this node) and exists is marked. A store takes the
// same lock: DROP OWNED waits for the marks made here.
int64 mark_roles_of(const KeyBackend &store, Oid relid, GoneRoles gone) {
  LockRelationOid(relid, RowExclusiveLock);
  AttrNumber scope_column = scope_column_of(relid);
  return settle_roles(store.roles_with_keys(relid, scope_column), relid,
                      scope_column, gone,
                      [&store, relid, scope_column](Oid role) {
                        return static_cast<int64>(
                            store.delete_keys_of(relid, scope_column, role));
                      });
}

// DROP OWNED's own check, made before anything is deleted.
void check_may_drop_owned(Oid role) {
  if (!has_privs_of_role(GetUserId(), role))
    ereport(ERROR, (errcode(ERRCODE_INSUFFICIENT_PRIVILEGE),
                    errmsg("permission denied to drop objects")));
}

} // namespace

void ensure(Relation keys, AttrNumber scope_column, Oid role) {
  ensure_marked(RelationGetRelid(keys), scope_column, role);
}

void ensure_tenant(Oid tenant_keys, Oid role) {
  ensure_marked(tenant_keys, InvalidAttrNumber, role);
}

int64 mark_key_roles() {
  int64 deleted = 0;
  for (int i = 0; i < key_backend_count; i++) {
    const KeyBackend &store = key_backend(i);
    Oid relid = store.relation();
    if (OidIsValid(relid))
      deleted += mark_roles_of(store, relid, GoneRoles::delete_keys);
  }
  return deleted;
}

namespace {

// Whether `grant` names `relid`, itself or among all tables of its schema.
// Only a GRANT or REVOKE on tables changes the privileges of a table's
// columns.
bool grant_names(const GrantStmt *grant, Oid relid) {
  if (grant->objtype != OBJECT_TABLE)
    return false;
  ListCell *cell;
  switch (grant->targtype) {
  case ACL_TARGET_OBJECT:
    foreach (cell, grant->objects)
      if (RangeVarGetRelid(lfirst_node(RangeVar, cell), NoLock, true) == relid)
        return true;
    return false;
  case ACL_TARGET_ALL_IN_SCHEMA: {
    Oid schema = get_rel_namespace(relid);
    foreach (cell, grant->objects)
      if (get_namespace_oid(strVal(lfirst(cell)), true) == schema)
        return true;
    return false;
  }
  default:
    return false;
  }
}

} // namespace

void keep_marks_after_grant(const GrantStmt *grant) {
  for (int i = 0; i < key_backend_count; i++) {
    const KeyBackend &store = key_backend(i);
    Oid relid = store.relation();
    if (OidIsValid(relid) && grant_names(grant, relid))
      (void)mark_roles_of(store, relid, GoneRoles::leave_keys);
  }
}

bool database_marks_roles() { return has_event_trigger(); }

void drop_owned_keys(const List *roles) {
  Oid relids[key_backend_count];
  AttrNumber scope_columns[key_backend_count];
  // Calls that may be storing keys finish first, and new ones wait until
  // DROP OWNED commits: no key of a dropped role can slip in meanwhile.
  for (int i = 0; i < key_backend_count; i++) {
    relids[i] = key_backend(i).relation();
    if (!OidIsValid(relids[i]))
      continue;
    LockRelationOid(relids[i], ShareRowExclusiveLock);
    // A table without its scope column holds no role's keys.
    scope_columns[i] = get_attnum(relids[i], "scope");
    if (scope_columns[i] == InvalidAttrNumber)
      relids[i] = InvalidOid;
  }
  ListCell *cell;
  foreach (cell, roles) {
    Oid role = get_rolespec_oid(lfirst_node(RoleSpec, cell), false);
    check_may_drop_owned(role);
    for (int i = 0; i < key_backend_count; i++) {
      if (!OidIsValid(relids[i]))
        continue;
      (void)key_backend(i).delete_keys_of(relids[i], scope_columns[i], role);
      shared_dependency::remove(relids[i], scope_columns[i], role);
    }
  }
  // Every backend looks its marks up again at its next store.
  for (Oid relid : relids)
    if (OidIsValid(relid))
      CacheInvalidateRelcacheByRelid(relid);
}

void at_commit() { recorded_in_transaction = false; }

void at_abort() {
  at_subtransaction_abort();
  recorded_in_transaction = false;
}

void at_subtransaction_abort() {
  if (recorded_in_transaction)
    for (Remembered &table : remembered)
      forget_all(table);
}

} // namespace idempotency::storage::role_marks
