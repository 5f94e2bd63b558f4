#include "idempotency/storage/tenant_keys.hpp"

#include "idempotency/storage/citus.hpp"
#include "idempotency/storage/key_store.hpp"
#include "idempotency/storage/keys.hpp"
#include "idempotency/storage/owner_statements.hpp"
#include "idempotency/storage/role_marks.hpp"

#include "idempotency/boundary/sqlstates.hpp"

#include "idempotency/settings/settings.hpp"

#include "idempotency/compat.hpp"

extern "C" {
#include "access/genam.h"
#include "access/htup_details.h"
#include "access/table.h"
#include "access/xact.h"
#include "catalog/pg_type.h"
#include "executor/tuptable.h"
#include "executor/spi.h"
#include "pgtime.h"
#include "storage/lmgr.h"
#include "storage/proc.h"
#include "utils/builtins.h"
#include "utils/datum.h"
#include "utils/fmgroids.h"
#include "utils/lsyscache.h"
#include "utils/rel.h"
#include "utils/snapmgr.h"
#include "utils/timestamp.h"
#include "utils/typcache.h"
}

namespace idempotency::storage::tenant_keys {

namespace {

Oid tenant_column_type(Oid relid) {
  AttrNumber column =
      OidIsValid(relid) ? get_attnum(relid, "tenant") : InvalidAttrNumber;
  return column == InvalidAttrNumber ? InvalidOid : get_atttype(relid, column);
}

// Kept for one tenant type, as custom plans, which Citus routes (see KeptPlan).
// Their $1 to $4 are the key's identity and its text.
KeptPlan insert_plans[2] = {{InvalidOid, nullptr, true},
                            {InvalidOid, nullptr, true}};
KeptPlan replace_plan{InvalidOid, nullptr, true};
KeptPlan remove_plan{InvalidOid, nullptr, true};

// The placement table_for() last checked; in the same subtransaction its lock
// is still held: no move has ended since, and store() need not check again.
LocalTransactionId checked_transaction = InvalidLocalTransactionId;
SubTransactionId checked_subtransaction = InvalidSubTransactionId;
Oid checked_shard = InvalidOid;

struct ShardColumns {
  AttrNumber tenant;
  AttrNumber scope;
  AttrNumber key;
  AttrNumber key_digest;
  AttrNumber request_hash;
  AttrNumber response;
  AttrNumber created_at;
  AttrNumber expires_at;
  AttrNumber expired_at;   // InvalidAttrNumber: 0.7, which keeps no tombstones
  AttrNumber remember_for; // InvalidAttrNumber before 1.1
};
static_assert(std::is_trivially_destructible_v<ShardColumns>);

// ALTER TABLE on the distributed table changes every shard alike.
ShardColumns shard_columns(Relation shard) {
  TupleDesc desc = RelationGetDescr(shard);
  // `type` InvalidOid: checked by table_for(); REGROLEOID: by fits_scope().
  auto column = [desc](const char *name, Oid type,
                       bool optional = false) -> AttrNumber {
    Form_pg_attribute found = find_column(desc, name);
    if (found == nullptr && optional)
      return InvalidAttrNumber;
    if (found == nullptr)
      ereport(ERROR,
              (errcode(ERRCODE_UNDEFINED_COLUMN),
               errmsg("column \"%s\" of idempotency.tenant_keys does not exist",
                      name)));
    bool fits = type == REGROLEOID ? fits_scope(found->atttypid)
                : OidIsValid(type) ? found->atttypid == type
                                   : true;
    if (!fits || found->attgenerated != '\0')
      ereport(ERROR,
              (errcode(ERRCODE_DATATYPE_MISMATCH),
               errmsg("column \"%s\" of idempotency.tenant_keys has type %s, "
                      "which the tenant_* functions cannot store",
                      name, format_type_be(found->atttypid))));
    return found->attnum;
  };
  return ShardColumns{column("tenant", InvalidOid),
                      column("scope", REGROLEOID),
                      column("key", TEXTOID),
                      column("key_digest", BYTEAOID),
                      column("request_hash", BYTEAOID),
                      column("response", JSONBOID),
                      column("created_at", TIMESTAMPTZOID),
                      column("expires_at", TIMESTAMPTZOID),
                      column("expired_at", TIMESTAMPTZOID, true),
                      column("remember_for", INTERVALOID, true)};
}

Datum copy_varlena(HeapTuple tuple, AttrNumber attnum, TupleDesc desc,
                   bool *is_null) {
  Datum value = heap_getattr(tuple, attnum, desc, is_null);
  return *is_null ? (Datum)0 : PointerGetDatum(PG_DETOAST_DATUM_COPY(value));
}

// Deletes the key's rows where `condition` (of k, $4: key, $5: `time`) holds.
uint64 delete_key_rows(KeptPlan &kept, const KeyTable &table, const KeyRef &key,
                       const char *condition, TimestampTz time) {
  Oid types[] = {key.tenant_type, REGROLEOID, BYTEAOID, TEXTOID,
                 TIMESTAMPTZOID};
  Datum args[] = {key.tenant, ObjectIdGetDatum(key.scope),
                  PointerGetDatum(key.digest), PointerGetDatum(key.key),
                  TimestampTzGetDatum(time)};
  OwnerSpi spi(table.owner);
  spi.run_kept(kept,
               psprintf("DELETE FROM idempotency.tenant_keys AS k WHERE"
                        " k.tenant OPERATOR(pg_catalog.=) $1"
                        " AND k.scope OPERATOR(idempotency.=)"
                        " $2::pg_catalog.regrole::idempotency.role_scope"
                        " AND k.key_digest OPERATOR(pg_catalog.=) $3 AND %s",
                        condition),
               lengthof(args), types, args, nullptr, false, SPI_OK_DELETE);
  uint64 deleted = SPI_processed;
  spi.finish();
  return deleted;
}

// Through Citus, so that it knows the transaction wrote the shard: later
// statements see the row, a coordinated transaction uses two-phase commit.
// Citus deparses, parses and plans it at each execution: hence few expressions.
StoredRow store_through_citus(const KeyTable &table, const KeyRef &key,
                              const NewRow &row, TimestampTz created_at,
                              TimestampTz expires_at, int64 remember_usecs) {
  Oid types[] = {key.tenant_type, REGROLEOID,     BYTEAOID,
                 TEXTOID,         BYTEAOID,       JSONBOID,
                 TIMESTAMPTZOID,  TIMESTAMPTZOID, INTERVALOID};
  bool window_is_null = false;
  Datum values[] = {key.tenant,
                    ObjectIdGetDatum(key.scope),
                    PointerGetDatum(key.digest),
                    PointerGetDatum(key.key),
                    PointerGetDatum(row.request_hash),
                    row.response,
                    TimestampTzGetDatum(created_at),
                    TimestampTzGetDatum(expires_at),
                    stored_window(remember_usecs, &window_is_null)};
  char nulls[] = "         ";
  nulls[5] = row.response_is_null ? 'n' : ' ';
  nulls[8] = window_is_null ? 'n' : ' ';
  bool with_window =
      get_attnum(table.relid, "remember_for") != InvalidAttrNumber;

  OwnerSpi spi(table.owner);
  spi.run_kept(
      insert_plans[with_window],
      psprintf("INSERT INTO idempotency.tenant_keys AS k"
               " (tenant, scope, key, key_digest, request_hash, response,"
               " created_at, expires_at%s) VALUES ($1,"
               " $2::pg_catalog.regrole::idempotency.role_scope, $4, $3, $5,"
               " $6, $7, $8%s) RETURNING k.created_at, k.expires_at,"
               " k.tenant, k.scope, k.key_digest, k.key",
               with_window ? ", remember_for" : "", with_window ? ", $9" : ""),
      with_window ? 9 : 8, types, values, nulls, false,
      SPI_OK_INSERT_RETURNING);
  // A BEFORE trigger may change the row, but not drop it.
  if (SPI_processed == 0)
    check_key_row_kept(TriggeredRow::skipped, "idempotency.tenant_keys", "",
                       key.key);
  Datum returned[6];
  bool nulls_returned[6];
  heap_deform_tuple(SPI_tuptable->vals[0], SPI_tuptable->tupdesc, returned,
                    nulls_returned);
  // Still the key's? The tenant is compared as the primary key compares it.
  TypeCacheEntry *tenant_type =
      lookup_type_cache(key.tenant_type, TYPECACHE_EQ_OPR_FINFO);
  if (nulls_returned[2] || nulls_returned[3] || nulls_returned[4] ||
      nulls_returned[5] || !OidIsValid(tenant_type->eq_opr_finfo.fn_oid) ||
      !DatumGetBool(FunctionCall2Coll(
          &tenant_type->eq_opr_finfo,
          TupleDescAttr(SPI_tuptable->tupdesc, 2)->attcollation, returned[2],
          key.tenant)) ||
      DatumGetObjectId(returned[3]) != key.scope ||
      !datum_image_eq(returned[4], PointerGetDatum(key.digest), false, -1) ||
      !datum_image_eq(returned[5], PointerGetDatum(key.key), false, -1))
    check_key_row_kept(TriggeredRow::moved, "idempotency.tenant_keys",
                       "tenant, scope, key or key_digest", key.key);
  StoredRow stored{DatumGetTimestampTz(returned[0]),
                   DatumGetTimestampTz(returned[1])};
  spi.finish();
  return stored;
}

} // namespace

// The placement lock covers the tenant's group of co-located shards, so fn's
// writes take the same lock: no order to deadlock on. Taken before the check,
// it keeps the check valid for the whole request; else a move could end in
// between and the request's writes land in a placement the move left behind.
KeyTable table_for(const KeyRef &key) {
  Oid relid = schema::relation("tenant_keys");
  if (!OidIsValid(relid))
    ereport(ERROR,
            (errcode(ERRCODE_UNDEFINED_TABLE),
             errmsg("table idempotency.tenant_keys does not exist"),
             errhint("A superuser creates it on the Citus coordinator with "
                     "SELECT idempotency.distribute_keys('table'), naming a "
                     "distributed table the keys are to be co-located with.")));
  if (citus::table_kind(relid) != citus::TableKind::distributed)
    ereport(ERROR,
            (errcode(ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE),
             errmsg("idempotency.tenant_keys is not a Citus distributed table"),
             errhint("Create it with idempotency.distribute_keys().")));
  citus::require_tested_citus();
  Oid column_type = tenant_column_type(relid);
  if (!OidIsValid(column_type))
    ereport(ERROR,
            (errcode(ERRCODE_UNDEFINED_COLUMN),
             errmsg("idempotency.tenant_keys has no column \"tenant\"")));
  if (column_type != key.tenant_type)
    ereport(
        ERROR,
        (errcode(ERRCODE_DATATYPE_MISMATCH),
         errmsg("tenant is of type %s, but idempotency.tenant_keys.tenant "
                "is of type %s",
                format_type_be(key.tenant_type), format_type_be(column_type)),
         errhint("Pass the tenant as %s, the type of the distribution "
                 "column the keys are co-located with.",
                 format_type_be(column_type))));
  Oid owner = table_owner::of(relid);
  citus::ShardPlacement shard =
      citus::lock_shard_of_value(relid, owner, key.tenant_type, key.tenant);
  Oid local_shard = shard.local_relation;
  if (OidIsValid(local_shard) && shard.placed_here) {
    checked_transaction = compat::my_local_transaction_id();
    checked_subtransaction = GetCurrentSubTransactionId();
    checked_shard = local_shard;
    return KeyTable{relid, local_shard, owner};
  }
  Oid output;
  bool is_varlena;
  getTypeOutputInfo(key.tenant_type, &output, &is_varlena);
  const char *tenant = OidOutputFunctionCall(output, key.tenant);
  // Shard here, placed elsewhere: Citus is moving it here or moved it away.
  if (OidIsValid(shard.relation_before_lock) || OidIsValid(local_shard))
    ereport(ERROR,
            (errcode(ERRCODE_T_R_SERIALIZATION_FAILURE),
             errmsg("the shard of tenant %s moved between nodes during the "
                    "request",
                    tenant),
             errdetail("Citus moved the tenant's shards between the moment it "
                       "sent the request to this node and the moment the "
                       "request reached the tenant's keys; nothing of the "
                       "request is kept."),
             errhint("Retry the request: Citus sends it to the node that "
                     "holds the tenant now.")));
  ereport(
      ERROR,
      (errcode(ERRCODE_FEATURE_NOT_SUPPORTED),
       errmsg("the idempotency keys of tenant %s are on another node", tenant),
       errdetail("A tenant's keys are read and written only on the node that "
                 "holds its shard of idempotency.tenant_keys, in the same "
                 "local transaction as the request's own work."),
       errhint("Call the tenant_* functions inside a function distributed "
               "with create_distributed_function(..., colocate_with => "
               "'idempotency.tenant_keys', force_delegation => true), whose "
               "distribution argument is this tenant: Citus runs it on that "
               "node. See the extension's docs/scale-out.md.")));
}

// Read by primary key straight from the tenant's shard, which table_for()'s
// placement lock keeps here; through Citus it costs several times as much.
KeyProbe probe(const KeyTable &table, const KeyRef &key, TimestampTz now) {
  Relation rel = table_open(table.local_shard, AccessShareLock);
  ShardColumns columns = shard_columns(rel);
  TupleDesc desc = RelationGetDescr(rel);
  Oid primary_key = compat::RelationGetPrimaryKeyIndex(rel, false);
  if (!OidIsValid(primary_key))
    ereport(ERROR,
            (errcode(ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE),
             errmsg("idempotency.tenant_keys has no primary key"),
             errhint("Add it back: PRIMARY KEY (tenant, scope, key_digest).")));

  TypeCacheEntry *tenant_type =
      lookup_type_cache(key.tenant_type, TYPECACHE_EQ_OPR_FINFO);
  if (!OidIsValid(tenant_type->eq_opr_finfo.fn_oid))
    ereport(ERROR, (errcode(ERRCODE_UNDEFINED_FUNCTION),
                    errmsg("type %s has no equality operator",
                           format_type_be(key.tenant_type))));
  // systable_beginscan maps the table's column numbers to the index's.
  ScanKeyData scan_keys[3];
  ScanKeyInit(&scan_keys[0], columns.tenant, BTEqualStrategyNumber,
              tenant_type->eq_opr_finfo.fn_oid, key.tenant);
  scan_keys[0].sk_collation =
      TupleDescAttr(desc, columns.tenant - 1)->attcollation;
  ScanKeyInit(&scan_keys[1], columns.scope, BTEqualStrategyNumber, F_OIDEQ,
              ObjectIdGetDatum(key.scope));
  ScanKeyInit(&scan_keys[2], columns.key_digest, BTEqualStrategyNumber,
              F_BYTEAEQ, PointerGetDatum(key.digest));

  // What the transaction wrote so far is seen, as by its next statement.
  CommandCounterIncrement();
  Snapshot snapshot = RegisterSnapshot(GetTransactionSnapshot());
  SysScanDesc scan =
      systable_beginscan(rel, primary_key, true, snapshot, 3, scan_keys);
  KeyProbe result{};
  result.state = KeyState::absent;
  result.response_is_null = true;
  HeapTuple tuple = systable_getnext(scan);
  if (tuple != nullptr) {
    bool is_null = false;
    // A tombstone keeps no key text: the digest is the key.
    bool tombstone = false;
    TimestampTz expired_at = 0;
    if (columns.expired_at != InvalidAttrNumber) {
      expired_at = DatumGetTimestampTz(
          heap_getattr(tuple, columns.expired_at, desc, &is_null));
      tombstone = !is_null;
    }
    Datum stored_key = heap_getattr(tuple, columns.key, desc, &is_null);
    if (!tombstone &&
        (is_null ||
         !datum_image_eq(stored_key, PointerGetDatum(key.key), false, -1)))
      report_shared_digest();
    result.created_at = DatumGetTimestampTz(
        heap_getattr(tuple, columns.created_at, desc, &is_null));
    result.expires_at = DatumGetTimestampTz(
        heap_getattr(tuple, columns.expires_at, desc, &is_null));
    RememberWindow window{};
    if (!tombstone)
      window = remember_window(columns, [&](AttrNumber attnum, bool *null) {
        return heap_getattr(tuple, attnum, desc, null);
      });
    RowLife life =
        row_life(tombstone, window, result.expires_at, expired_at, now);
    if (life.age == RowAge::forgotten) {
      result.state = KeyState::expired;
      result.expires_at = life.forgotten_at;
    } else {
      result.state = life.age == RowAge::gone ? KeyState::gone : KeyState::done;
      result.request_hash = reinterpret_cast<bytea *>(DatumGetPointer(
          copy_varlena(tuple, columns.request_hash, desc, &is_null)));
      if (life.age == RowAge::gone) {
        result.expires_at = life.forgotten_at;
        result.response_expired_at = life.response_expired_at;
      } else {
        result.response = copy_varlena(tuple, columns.response, desc,
                                       &result.response_is_null);
      }
    }
  }
  systable_endscan(scan);
  UnregisterSnapshot(snapshot);
  table_close(rel, NoLock);
  return result;
}

StoredRow store(const KeyTable &table, const KeyRef &key, const NewRow &row) {
  TimestampTz created_at = GetCurrentTimestamp();
  TimestampTz expires_at = settings::key_expiry(created_at, row.ttl);
  // Fixed now, as for a role's key (storage/keys.cpp).
  int64 remember_usecs = settings::remember_usecs(expires_at, row.remember);

  // Under the lock the insert takes anyway (see role_marks.hpp).
  LockRelationOid(table.relid, RowExclusiveLock);
  role_marks::ensure_tenant(table.relid, key.scope);
  if (row.replaces != nullptr)
    delete_key_rows(replace_plan, table, key,
                    "k.expires_at OPERATOR(pg_catalog.<=) $5", created_at);

  // A placement lock taken in a subtransaction that rolled back is gone.
  bool still_checked =
      checked_transaction == compat::my_local_transaction_id() &&
      checked_subtransaction == GetCurrentSubTransactionId() &&
      checked_shard == table.local_shard;
  KeyTable checked = still_checked ? table : table_for(key);

  MemoryContext caller = CurrentMemoryContext;
  StoredRow stored{};
  PG_TRY();
  {
    stored = store_through_citus(checked, key, row, created_at, expires_at,
                                 remember_usecs);
  }
  PG_CATCH();
  {
    // Another transaction stored the key first; for a replacing row, expiry
    // made the expired one a tombstone still in its window: 40001, IK410 next.
    MemoryContextSwitchTo(caller);
    ErrorData *error = CopyErrorData();
    if (error->sqlerrcode != ERRCODE_UNIQUE_VIOLATION)
      PG_RE_THROW();
    FlushErrorState();
    if (row.replaces != nullptr)
      report_replaced_row_changed();
    ereport(ERROR,
            (errcode(errcode_key_in_progress),
             errmsg("idempotency key was stored by another transaction first"),
             errdetail("Another transaction claimed the key on another node "
                       "(the tenant's shard was moving) and committed it."),
             errhint("Retry the request: it replays the stored response.")));
  }
  PG_END_TRY();
  return stored;
}

// The row probe() found, by its key (a tombstone's is empty) and creation
// time: a row the key got since is another request's.
bool remove(const KeyTable &table, const KeyRef &key, const KeyProbe &stored) {
  return delete_key_rows(remove_plan, table, key,
                         "(k.key OPERATOR(pg_catalog.=) $4 OR "
                         "k.key OPERATOR(pg_catalog.=) '') AND "
                         "k.created_at OPERATOR(pg_catalog.=) $5",
                         stored.created_at) > 0;
}

// Citus finds the expired keys on every shard, unpaced by expire_rate.
void collect_expired(ExpiryRound &round, int) {
  round.has_batch = true;
  round.finished = true;
  round.paced = false;
}

// As the local keys' expiry: deletes keys expired at $1 whose window passed too
// and tombstones past theirs, then makes other expired keys tombstones.
ExpiryBatch expire_batch(ExpiryRound &round, int) {
  round.has_batch = false;
  Oid relid = relation();
  // Citus runs the statements on every shard: once, from the coordinator.
  if (!OidIsValid(relid) || citus::local_group() != 0)
    return ExpiryBatch{0, 0};
  bool keeps_tombstones = get_attnum(relid, "expired_at") != InvalidAttrNumber;
  bool stores_window = get_attnum(relid, "remember_for") != InvalidAttrNumber;
  bool remember = keeps_tombstones && settings::remember_keys();
  OwnerSpi spi(table_owner::of(relid));
  Oid types[4] = {TIMESTAMPTZOID, TEXTOID, INTERVALOID, INTERVALOID};
  Datum values[4] = {TimestampTzGetDatum(round.cutoff)};
  // When a key of 1.1 is forgotten (storage/keys.hpp, live_row_forgotten_at),
  // in immutable functions only, which Citus accepts in an UPDATE and
  // evaluates alike on every node. $3 is 7 days; $2 and $4 are unused.
  const char *forgotten_at =
      "pg_catalog.timezone('UTC', pg_catalog.timezone('UTC', k.expires_at)"
      " OPERATOR(pg_catalog.+) COALESCE(k.remember_for, $3))";
  if (keeps_tombstones && stores_window) {
    auto *default_window = static_cast<Interval *>(palloc(sizeof(Interval)));
    *default_window = Interval{rows_without_window_usecs, 0, 0};
    values[1] = CStringGetTextDatum("");
    values[2] = IntervalPGetDatum(default_window);
    values[3] = IntervalPGetDatum(default_window);
  } else if (!remember) {
    spi.run("DELETE FROM idempotency.tenant_keys AS k"
            " WHERE k.expires_at OPERATOR(pg_catalog.<=) $1",
            1, types, values, nullptr, false, SPI_OK_DELETE);
    int64 deleted = (int64)SPI_processed;
    spi.finish();
    return ExpiryBatch{deleted, deleted};
  } else {
    // expires_at + idempotency.remember as settings::forgotten_at() adds it:
    // months and days in this session's time zone, then the time.
    const Interval &span = settings::remember();
    auto *calendar = static_cast<Interval *>(palloc(sizeof(Interval)));
    *calendar = Interval{0, span.day, span.month};
    auto *clock = static_cast<Interval *>(palloc(sizeof(Interval)));
    *clock = Interval{span.time, 0, 0};
    values[1] = CStringGetTextDatum(pg_get_timezone_name(session_timezone));
    values[2] = IntervalPGetDatum(calendar);
    values[3] = IntervalPGetDatum(clock);
    forgotten_at =
        "pg_catalog.timezone('UTC', pg_catalog.timezone('UTC',"
        " pg_catalog.timezone($2, pg_catalog.timezone($2, k.expires_at)"
        " OPERATOR(pg_catalog.+) $3)) OPERATOR(pg_catalog.+) $4)";
  }
  spi.run(psprintf("DELETE FROM idempotency.tenant_keys AS k"
                   " WHERE k.expires_at OPERATOR(pg_catalog.<=) $1"
                   " AND (k.expired_at IS NOT NULL OR %s"
                   " OPERATOR(pg_catalog.<=) $1)",
                   forgotten_at),
          4, types, values, nullptr, false, SPI_OK_DELETE);
  int64 done = (int64)SPI_processed;
  spi.run(psprintf("UPDATE idempotency.tenant_keys AS k"
                   " SET key = '', response = NULL,"
                   " expired_at = k.expires_at, expires_at = %s"
                   " WHERE k.expired_at IS NULL"
                   " AND k.expires_at OPERATOR(pg_catalog.<=) $1",
                   forgotten_at),
          4, types, values, nullptr, false, SPI_OK_UPDATE);
  done += (int64)SPI_processed;
  spi.finish();
  return ExpiryBatch{done, done};
}

Oid relation() {
  Oid relid = schema::relation("tenant_keys");
  if (!OidIsValid(relid) ||
      citus::table_kind(relid) != citus::TableKind::distributed)
    return InvalidOid;
  return relid;
}

// Roles' OIDs differ between nodes: each node settles its own shards' roles.
role_keys::Roles roles_with_keys(Oid relid, AttrNumber) {
  return role_keys::in_shards(citus::local_shard_relations(relid),
                              table_owner::of(relid));
}

uint64 delete_keys_of(Oid relid, AttrNumber scope_column, Oid role) {
  Oid scope_type = get_atttype(relid, scope_column);
  Oid owner = table_owner::of(relid);
  List *shards = citus::local_shard_relations(relid);
  uint64 deleted = 0;
  ListCell *cell;
  foreach (cell, shards)
    deleted += role_keys::delete_in(lfirst_oid(cell), owner, scope_type, role);
  return deleted;
}

Oid tenant_type() {
  Oid type = tenant_column_type(schema::relation("tenant_keys"));
  return OidIsValid(type) ? type : TEXTOID;
}

} // namespace idempotency::storage::tenant_keys
