#include "idempotency/settings/sqlstate_list.hpp"

#include "idempotency/storage/keys.hpp"

#include <algorithm>
#include <initializer_list>

#include "idempotency/storage/commit_guard.hpp"
#include "idempotency/storage/role_marks.hpp"
#include "idempotency/storage/owner_statements.hpp"
#include "idempotency/storage/tenant_keys.hpp"

#include "idempotency/settings/settings.hpp"

#include "idempotency/boundary/subtransaction.hpp"

#include "idempotency/compat.hpp"

extern "C" {
#include "access/genam.h"
#include "access/table.h"
#include "access/tableam.h"
#include "access/xact.h"
#include "utils/rel.h"
#include "catalog/pg_trigger.h"
#include "commands/trigger.h"
#include "catalog/pg_am.h"
#include "catalog/pg_opfamily.h"
#include "common/int.h"
#include "catalog/pg_proc.h"
#include "catalog/pg_type.h"
#include "miscadmin.h"
#include "storage/lmgr.h"
#include "parser/parse_func.h"
#include "utils/array.h"
#include "utils/builtins.h"
#include "utils/datum.h"
#include "utils/fmgroids.h"
#include "utils/inval.h"
#include "utils/lsyscache.h"
#include "utils/snapmgr.h"
#include "utils/syscache.h"
}

namespace idempotency::storage {

namespace {

[[noreturn]] void report_missing_table() {
  ereport(ERROR, (errcode(ERRCODE_UNDEFINED_TABLE),
                  errmsg("table idempotency.keys does not exist"),
                  errhint("Run CREATE EXTENSION idempotency.")));
}

// Kept until an invalidation of the table or a schema; ALTER TABLE, VACUUM
// FULL, CLUSTER (same oid) and Citus adding or removing it send one too.

struct KeyColumns {
  AttrNumber scope;
  AttrNumber key;
  AttrNumber key_digest;
  AttrNumber request_hash;
  AttrNumber response;
  AttrNumber created_at;
  AttrNumber expires_at;
  // InvalidAttrNumber in tables not yet updated: expired_at (set in a
  // tombstone only) came with 1.0, remember_for with 1.1.
  AttrNumber expired_at;
  AttrNumber remember_for;
};

struct TableCache {
  bool relid_known;
  bool columns_known;
  bool citus_known;
  uint64 invalidations; // of the table, counted to spot one during a rebuild
  Oid relid;
  citus::TableKind citus_kind;
  KeyColumns columns;
  Oid scope_type;
  // A BEFORE INSERT row trigger other than keys_loaded may change our rows.
  bool rows_may_change;
  // Freed once the table changed (plans_stale) and none of them runs.
  KeptPlan insert_key;
  KeptPlan insert_key_returning;
  KeptPlan insert_tombstones;
  KeptPlan delete_version;
  KeptPlan version_exists;
  KeptPlan delete_expired;
  bool plans_stale;
  int running;
  LocalTransactionId running_in;
};

TableCache cache;

void forget_relation(Datum, Oid relid) {
  if (relid == InvalidOid || relid == cache.relid) {
    cache.relid_known = false;
    cache.columns_known = false;
    cache.citus_known = false;
    cache.plans_stale = true;
    cache.invalidations++;
  }
}

// A renamed or dropped schema may change what "idempotency.keys" names.
void forget_namespaces(Datum, compat::SysCacheIdentifier, uint32) {
  cache.relid_known = false;
  cache.plans_stale = true;
}

void watch_invalidations() {
  static bool watching = false;
  if (watching)
    return;
  CacheRegisterRelcacheCallback(forget_relation, (Datum)0);
  CacheRegisterSyscacheCallback(NAMESPACEOID, forget_namespaces, (Datum)0);
  watching = true;
}

struct ExpectedColumn {
  const char *name;
  Oid type; // InvalidOid: scope, see fits_scope()
  AttrNumber KeyColumns::*field;
  bool optional; // added by an update: a table not yet updated has none
};

constexpr ExpectedColumn expected_columns[] = {
    {"scope", InvalidOid, &KeyColumns::scope, false},
    {"key", TEXTOID, &KeyColumns::key, false},
    {"key_digest", BYTEAOID, &KeyColumns::key_digest, false},
    {"request_hash", BYTEAOID, &KeyColumns::request_hash, false},
    {"response", JSONBOID, &KeyColumns::response, false},
    {"created_at", TIMESTAMPTZOID, &KeyColumns::created_at, false},
    {"expires_at", TIMESTAMPTZOID, &KeyColumns::expires_at, false},
    {"expired_at", TIMESTAMPTZOID, &KeyColumns::expired_at, true},
    {"remember_for", INTERVALOID, &KeyColumns::remember_for, true},
};

// Refuses columns the extension could not read or write correctly: a value
// stored under another type would be misread later. An invalidation of the
// table the catalog lookups take in leaves what was found to this call only.
void remember_columns(Relation rel) {
  uint64 invalidations = cache.invalidations;
  TupleDesc desc = RelationGetDescr(rel);
  Oid loader = LookupFuncName(list_make2(makeString(pstrdup("idempotency")),
                                         makeString(pstrdup("keys_loaded"))),
                              0, nullptr, true);
  // The library serves the table as 0.7 and later make it; earlier tables
  // lack key_digest or hold other digests in it, which the C function of
  // their loader trigger keys_loaded (protocol/loaded_rows.hpp) tells apart.
  HeapTuple proc = SearchSysCache1(PROCOID, ObjectIdGetDatum(loader));
  bool isnull = true;
  Datum symbol =
      HeapTupleIsValid(proc)
          ? SysCacheGetAttr(PROCOID, proc, Anum_pg_proc_prosrc, &isnull)
          : (Datum)0;
  if (find_column(desc, "key_digest") == nullptr || isnull ||
      strcmp(TextDatumGetCString(symbol), "idempotency_ordered_keys_loaded") !=
          0)
    report_schema_before_0_7();
  ReleaseSysCache(proc);
  KeyColumns columns{};
  for (ExpectedColumn expected : expected_columns) {
    Form_pg_attribute attribute = find_column(desc, expected.name);
    if (attribute == nullptr && expected.optional)
      continue;
    if (attribute == nullptr)
      ereport(ERROR,
              (errcode(ERRCODE_UNDEFINED_COLUMN),
               errmsg("column \"%s\" of idempotency.keys does not exist",
                      expected.name),
               errdetail("idempotent_call reads and writes this column."),
               errhint("Restore the column, or reinstall the extension.")));
    bool fits = OidIsValid(expected.type) ? attribute->atttypid == expected.type
                                          : fits_scope(attribute->atttypid);
    if (!fits || attribute->attgenerated != '\0')
      ereport(
          ERROR,
          (errcode(ERRCODE_DATATYPE_MISMATCH),
           errmsg("column \"%s\" of idempotency.keys has type %s, which "
                  "idempotent_call cannot store",
                  expected.name, format_type_be(attribute->atttypid)),
           errdetail("idempotent_call stores %s in this column, unchanged "
                     "and not generated.",
                     OidIsValid(expected.type) ? format_type_be(expected.type)
                                               : "the calling role's oid"),
           errhint("Change the column back with ALTER TABLE "
                   "idempotency.keys ALTER COLUMN %s TYPE %s.",
                   expected.name,
                   format_type_be(OidIsValid(expected.type) ? expected.type
                                                            : REGROLEOID))));
    columns.*expected.field = attribute->attnum;
  }
  cache.columns = columns;
  cache.rows_may_change = false;
  const TriggerDesc *triggers = rel->trigdesc;
  for (int i = 0; triggers != nullptr && triggers->trig_insert_before_row &&
                  i < triggers->numtriggers;
       i++) {
    const Trigger &trigger = triggers->triggers[i];
    if (TRIGGER_FOR_ROW(trigger.tgtype) && TRIGGER_FOR_BEFORE(trigger.tgtype) &&
        TRIGGER_FOR_INSERT(trigger.tgtype) && trigger.tgfoid != loader &&
        trigger.tgenabled != TRIGGER_DISABLED)
      cache.rows_may_change = true;
  }
  cache.scope_type = TupleDescAttr(desc, columns.scope - 1)->atttypid;
  cache.plans_stale = true;
  if (cache.relid != RelationGetRelid(rel))
    cache.citus_known = false;
  cache.relid = RelationGetRelid(rel);
  cache.columns_known = cache.invalidations == invalidations;
}

bool find_table() {
  watch_invalidations();
  if (cache.relid_known)
    return true;
  Oid relid = schema::relation("keys");
  if (!OidIsValid(relid))
    return false;
  if (relid != cache.relid) {
    cache.columns_known = false;
    cache.citus_known = false;
  }
  cache.relid = relid;
  cache.relid_known = true;
  return true;
}

citus::TableKind cached_citus_kind() {
  if (cache.citus_known)
    return cache.citus_kind;
  uint64 invalidations = cache.invalidations;
  cache.citus_kind = citus::table_kind(cache.relid);
  cache.citus_known = cache.invalidations == invalidations;
  return cache.citus_kind;
}

void refuse_citus_table() {
  citus::TableKind kind = cached_citus_kind();
  if (kind != citus::TableKind::not_citus)
    citus::report_citus_table(kind);
}

// The same instant for every reader (see live_row_forgotten_at).
int64 exact_usecs(const Interval &span) {
  int64 usecs = span.time;
  int64 days = (int64)span.month * DAYS_PER_MONTH + span.day;
  if (pg_mul_s64_overflow(days, USECS_PER_DAY, &days) ||
      pg_add_s64_overflow(usecs, days, &usecs))
    return span.time < 0 || days < 0 ? 0 : PG_INT64_MAX;
  return Max(usecs, 0);
}

// Citus is checked again with `rel` open: a conversion that committed while
// this waited for the table's lock arrives with the lock.
const KeyColumns &key_columns(Relation rel) {
  watch_invalidations();
  if (!cache.columns_known || cache.relid != RelationGetRelid(rel))
    remember_columns(rel);
  refuse_citus_table();
  return cache.columns;
}

Datum copy_varlena(HeapTuple tuple, AttrNumber attnum, TupleDesc desc,
                   bool *isnull) {
  Datum value = heap_getattr(tuple, attnum, desc, isnull);
  if (*isnull)
    return (Datum)0;
  return PointerGetDatum(PG_DETOAST_DATUM_COPY(value));
}

} // namespace

TimestampTz live_row_forgotten_at(const RememberWindow &window,
                                  TimestampTz expires_at) {
  switch (window.source) {
  case WindowSource::none:
    return expires_at;
  case WindowSource::reader_setting:
    return settings::forgotten_at(expires_at);
  case WindowSource::stored:
    break;
  }
  if (TIMESTAMP_NOT_FINITE(expires_at))
    return expires_at;
  int64 usecs = window.stored_isnull ? rows_without_window_usecs
                                     : exact_usecs(window.stored);
  TimestampTz forgotten_at;
  if (pg_add_s64_overflow(expires_at, usecs, &forgotten_at) ||
      !IS_VALID_TIMESTAMP(forgotten_at))
    return DT_NOEND;
  return forgotten_at;
}

Datum stored_window(int64 usecs, bool *isnull) {
  *isnull = usecs == rows_without_window_usecs;
  if (*isnull)
    return (Datum)0;
  auto *span = static_cast<Interval *>(palloc0(sizeof(Interval)));
  span->time = usecs;
  return IntervalPGetDatum(span);
}

RowLife row_life(bool tombstone, const RememberWindow &window,
                 TimestampTz expires_at, TimestampTz expired_at,
                 TimestampTz now) {
  RowLife life{};
  if (tombstone) {
    life.response_expired_at = expired_at;
    life.forgotten_at = expires_at;
  } else {
    if (expires_at > now) {
      life.age = RowAge::live; // the common case: no more to compute
      return life;
    }
    life.response_expired_at = expires_at;
    life.forgotten_at = live_row_forgotten_at(window, expires_at);
  }
  life.age = life.forgotten_at <= now ? RowAge::forgotten : RowAge::gone;
  return life;
}

void report_schema_before_0_7() {
  ereport(ERROR,
          (errcode(ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE),
           errmsg("the idempotency extension in this database is older than "
                  "0.7, which this library no longer serves"),
           errdetail("The library of version %s serves the schemas of "
                     "versions 0.7 and later; older versions stored keys in "
                     "another layout.",
                     IDEMPOTENCY_VERSION),
           errhint("Update the extension to 0.7 with the library of 0.7 "
                   "(ALTER EXTENSION idempotency UPDATE TO '0.7'), then "
                   "install this library and run ALTER EXTENSION "
                   "idempotency UPDATE.")));
}

KeyTable key_table() {
  if (!find_table())
    report_missing_table();
  refuse_citus_table();
  return KeyTable{cache.relid, InvalidOid, InvalidOid};
}

citus::TableKind key_table_citus_kind() {
  return find_table() ? cached_citus_kind() : citus::TableKind::not_citus;
}

namespace {

// The next row of the key the scan's dirty snapshot sees, as
// systable_getnext; `missed` is set when an index entry led to no such row.
HeapTuple next_key_row(SysScanDesc scan, bool &missed) {
  IndexScanDesc index = scan->iscan;
  for (;;) {
    // A HOT chain may hold more than one row a dirty snapshot sees.
    if (!index->xs_heap_continue &&
        index_getnext_tid(index, ForwardScanDirection) == nullptr)
      return nullptr;
    if (index_fetch_heap(index, scan->slot)) {
      bool should_free;
      return ExecFetchSlotHeapTuple(scan->slot, false, &should_free);
    }
    missed = true;
  }
}

// One look at `key`'s rows; `missed` as next_key_row.
KeyProbe read_key(Relation rel, const KeyColumns &columns, const KeyRef &key,
                  TimestampTz now, bool &missed) {
  TupleDesc desc = RelationGetDescr(rel);
  // systable_beginscan maps the table's column numbers to the index's.
  ScanKeyData scan_keys[2];
  ScanKeyInit(&scan_keys[0], columns.scope, BTEqualStrategyNumber, F_OIDEQ,
              ObjectIdGetDatum(key.scope));
  ScanKeyInit(&scan_keys[1], columns.key_digest, BTEqualStrategyNumber,
              F_BYTEAEQ, PointerGetDatum(key.digest));

  SnapshotData dirty;
  InitDirtySnapshot(dirty);
  SysScanDesc scan =
      systable_beginscan(rel, compat::RelationGetPrimaryKeyIndex(rel, false),
                         true, &dirty, 2, scan_keys);

  KeyProbe result{};
  result.state = KeyState::absent;
  HeapTuple tuple;
  while ((tuple = next_key_row(scan, missed)) != nullptr) {
    auto read = [&](AttrNumber attnum, bool *isnull) {
      return heap_getattr(tuple, attnum, desc, isnull);
    };
    // A tombstone keeps no key text: the digest is the key.
    bool isnull = true;
    if (columns.expired_at != InvalidAttrNumber)
      (void)read(columns.expired_at, &isnull);
    bool tombstone = !isnull;
    if (!tombstone) {
      Datum stored = read(columns.key, &isnull);
      if (isnull ||
          !datum_image_eq(stored, PointerGetDatum(key.key), false, -1))
        report_shared_digest();
    }
    // A dirty snapshot reports an open inserter in xmin, an open deleter in
    // xmax. A live row being inserted: another transaction holds the key; a
    // tombstone being inserted (by expiry, a restore) is judged by its times.
    if (TransactionIdIsValid(dirty.xmin) && !tombstone) {
      result = KeyProbe{};
      result.state = KeyState::in_progress;
      result.holder = dirty.xmin;
      break;
    }
    TimestampTz expires_at =
        DatumGetTimestampTz(read(columns.expires_at, &isnull));
    TimestampTz expired_at =
        tombstone ? DatumGetTimestampTz(read(columns.expired_at, &isnull)) : 0;
    RememberWindow window{};
    if (!tombstone && expires_at <= now)
      window = remember_window(columns, read);
    RowLife times = row_life(tombstone, window, expires_at, expired_at, now);
    // A row whose response expired being deleted, by expiry or by a caller
    // replacing it (who holds the claim), is judged by its times; store()
    // waits for that delete to end. A live row being deleted: wait.
    if (TransactionIdIsValid(dirty.xmax) && times.age == RowAge::live) {
      result = KeyProbe{};
      result.state = KeyState::in_progress;
      result.holder = dirty.xmax;
      break;
    }
    result = KeyProbe{};
    result.tid = tuple->t_self;
    result.xmin = HeapTupleHeaderGetRawXmin(tuple->t_data);
    result.created_at = DatumGetTimestampTz(read(columns.created_at, &isnull));
    result.expires_at = times.forgotten_at;
    if (times.age == RowAge::forgotten) {
      result.state = KeyState::expired;
      continue; // the key's new row, if any, may come next
    }
    result.request_hash = reinterpret_cast<bytea *>(DatumGetPointer(
        copy_varlena(tuple, columns.request_hash, desc, &isnull)));
    // A gone key's retry is refused by times alone: a tombstone expiry is
    // writing answers as the committed one will, and under REPEATABLE READ one
    // written after the snapshot stands for the live row the snapshot saw.
    if (times.age == RowAge::gone) {
      result.state = KeyState::gone;
      result.response_expired_at = times.response_expired_at;
      result.response_is_null = true;
      break;
    }
    // Under REPEATABLE READ and SERIALIZABLE a replay must not hand out a row
    // the snapshot cannot see; ON CONFLICT raises the same error.
    TransactionId xmin = HeapTupleHeaderGetXmin(tuple->t_data);
    if (IsolationUsesXactSnapshot() &&
        !TransactionIdIsCurrentTransactionId(xmin) &&
        !table_tuple_satisfies_snapshot(rel, scan->slot,
                                        GetTransactionSnapshot()))
      ereport(ERROR,
              (errcode(ERRCODE_T_R_SERIALIZATION_FAILURE),
               errmsg("could not serialize access due to concurrent update"),
               errdetail("The idempotency key was stored by a transaction "
                         "that committed after this transaction's "
                         "snapshot.")));
    result.state = KeyState::done;
    result.expires_at = expires_at;
    result.response =
        copy_varlena(tuple, columns.response, desc, &result.response_is_null);
    break;
  }

  systable_endscan(scan);
  return result;
}

} // namespace

KeyProbe KeyStore::probe(const KeyRef &key, TimestampTz now) const {
  if (kind_ == KeyTableKind::tenant)
    return tenant_keys::probe(table_, key, now);
  Relation rel = table_open(table_.relid, AccessShareLock);
  KeyColumns columns = key_columns(rel);
  // A scan reads a page's index entries at once, their rows later: expiry
  // committing a tombstone in between leaves it the live row's entry, to a gone
  // row; a second scan sees the tombstone's, inserted before the commit.
  bool missed = false;
  KeyProbe result = read_key(rel, columns, key, now, missed);
  if (missed &&
      (result.state == KeyState::absent || result.state == KeyState::expired))
    result = read_key(rel, columns, key, now, missed);
  table_close(rel, NoLock);
  return result;
}

[[noreturn]] void report_replaced_row_changed() {
  ereport(ERROR, (errcode(ERRCODE_T_R_SERIALIZATION_FAILURE),
                  errmsg("could not serialize access due to concurrent update"),
                  errdetail("An expired idempotency key was changed while "
                            "being replaced.")));
}

namespace {

constexpr int insert_key_args = 8;
enum InsertedColumn { inserted_scope = 1, inserted_digest, inserted_key };

const char *insert_into_sql() {
  return psprintf(
      "INSERT INTO idempotency.keys AS k (scope, key, "
      "key_digest, request_hash, response, created_at, expires_at"
      "%s%s)",
      cache.columns.expired_at != InvalidAttrNumber ? ", expired_at" : "",
      cache.columns.remember_for != InvalidAttrNumber ? ", remember_for" : "");
}

constexpr const char *inserted_identity =
    " RETURNING k.scope, k.key_digest, k.key";

// $1 scope, $2 key, $3 key_digest, $4 request_hash, $5 response,
// $6 created_at, $7 expires_at, $8 remember_for; expired_at is NULL.
const char *insert_key_sql(bool returning) {
  return psprintf("%s VALUES ($1, $2, $3, $4, $5, $6, $7%s%s)%s%s",
                  insert_into_sql(),
                  cache.columns.expired_at != InvalidAttrNumber ? ", NULL" : "",
                  cache.columns.remember_for != InvalidAttrNumber ? ", $8" : "",
                  returning ? inserted_identity : "",
                  returning ? ", k.created_at, k.expires_at" : "");
}

// One array per column, one element per key: $1 scope, $2 key_digest,
// $3 request_hash, $4 created_at, $5 expires_at (when the tombstone goes),
// $6 expired_at, $7 remember_for.
const char *insert_tombstones_sql() {
  return psprintf(
      "%s SELECT t.scope, '', t.digest, t.hash, NULL, t.created_at,"
      " t.forgotten_at, t.expired_at%s"
      " FROM ROWS FROM (pg_catalog.unnest($1), pg_catalog.unnest($2),"
      " pg_catalog.unnest($3), pg_catalog.unnest($4),"
      " pg_catalog.unnest($5), pg_catalog.unnest($6),"
      " pg_catalog.unnest($7)) AS"
      " t(scope, digest, hash, created_at, forgotten_at,"
      " expired_at, remember_for)%s",
      insert_into_sql(),
      cache.columns.remember_for != InvalidAttrNumber ? ", t.remember_for" : "",
      inserted_identity);
}

// That row version of that key only: $1 ctid, $2 xmin, $3 scope (with
// role_scope's own operator, or oid's for regrole), $4 key_digest.
const char *delete_version_sql() {
  return psprintf("DELETE FROM idempotency.keys AS k"
                  " WHERE k.ctid OPERATOR(pg_catalog.=) $1"
                  " AND k.xmin OPERATOR(pg_catalog.=) $2"
                  " AND k.scope %s $3"
                  " AND k.key_digest OPERATOR(pg_catalog.=) $4",
                  getBaseType(cache.scope_type) == REGROLEOID
                      ? "OPERATOR(pg_catalog.=)"
                      : "OPERATOR(idempotency.=)");
}

// Rows $1 (tid[]) still expired at $2, unless locked: expiry waits for no one.
const char *delete_expired_sql() {
  const KeyColumns &columns = cache.columns;
  return psprintf(
      "DELETE FROM idempotency.keys AS k"
      " WHERE k.ctid OPERATOR(pg_catalog.=) ANY (ARRAY(SELECT l.ctid"
      " FROM idempotency.keys AS l"
      " WHERE l.ctid OPERATOR(pg_catalog.=) ANY ($1)"
      " AND l.expires_at OPERATOR(pg_catalog.<=) $2"
      " FOR UPDATE OF l SKIP LOCKED))"
      " AND k.expires_at OPERATOR(pg_catalog.<=) $2"
      " RETURNING k.scope, k.key_digest, k.request_hash, k.created_at,"
      " k.expires_at, %s, %s",
      columns.expired_at != InvalidAttrNumber ? "k.expired_at"
                                              : "NULL::pg_catalog.timestamptz",
      columns.remember_for != InvalidAttrNumber ? "k.remember_for"
                                                : "NULL::pg_catalog.interval");
}

// The rows the extension is inserting: a key's row, or tombstones.
struct OwnInsert {
  LocalTransactionId transaction;
  bool tombstones;
  Oid scope;
  const bytea *digest;
};
static_assert(std::is_trivially_destructible_v<OwnInsert>);

OwnInsert own_insert;

void run_own_insert(OwnerSpi &spi, KeptPlan &kept, const char *sql, int nargs,
                    Oid *types, Datum *values, const char *nulls,
                    OwnInsert inserting, int expected) {
  OwnInsert outer = own_insert;
  inserting.transaction = compat::my_local_transaction_id();
  own_insert = inserting;
  spi.run_kept(kept, sql, nargs, types, values, nulls, false, expected);
  own_insert = outer;
}

// Raises 09000 if a BEFORE trigger moved the row `inserted_identity` returns.
void check_not_moved(HeapTuple row, TupleDesc desc, Oid scope,
                     const bytea *digest, text *key) {
  bool isnull[3];
  Datum stored_scope = SPI_getbinval(row, desc, inserted_scope, &isnull[0]);
  Datum stored_digest = SPI_getbinval(row, desc, inserted_digest, &isnull[1]);
  Datum stored_key = SPI_getbinval(row, desc, inserted_key, &isnull[2]);
  if (isnull[0] || isnull[1] || isnull[2] ||
      DatumGetObjectId(stored_scope) != scope ||
      !datum_image_eq(stored_digest, PointerGetDatum(digest), false, -1) ||
      !datum_image_eq(stored_key, PointerGetDatum(key), false, -1))
    check_key_row_kept(TriggeredRow::moved, "idempotency.keys",
                       "scope, key or key_digest", key);
}

// Locks the table and checks its columns (and Citus) with the lock held;
// `marked`'s role gets its mark. Stale plans are freed, never while one runs (a
// trigger's own call may come here during the INSERT); the count restarts each
// transaction, as an error ends the statements it interrupts.
OwnerSpi begin_statements(Oid relid, const KeyRef *marked) {
  // fn may have dropped the extension before a store; the error rolls it back.
  Relation rel = marked == nullptr ? table_open(relid, RowExclusiveLock)
                                   : try_table_open(relid, RowExclusiveLock);
  if (rel == nullptr)
    report_missing_table();
  AttrNumber scope_column = key_columns(rel).scope;
  Oid owner = rel->rd_rel->relowner;
  if (marked != nullptr)
    role_marks::ensure(rel, scope_column, marked->scope);
  table_close(rel, NoLock);
  if (cache.running_in != compat::my_local_transaction_id()) {
    cache.running_in = compat::my_local_transaction_id();
    cache.running = 0;
  }
  if (cache.plans_stale && cache.running == 0) {
    for (KeptPlan *kept : {&cache.insert_key, &cache.insert_key_returning,
                           &cache.insert_tombstones, &cache.delete_version,
                           &cache.version_exists, &cache.delete_expired})
      forget_plan(*kept);
    cache.plans_stale = false;
  }
  cache.running++;
  return OwnerSpi(owner);
}

void end_statements(OwnerSpi &spi) {
  spi.finish();
  cache.running--;
}

// Deletes `key`'s row version `version` with a snapshot taken now; false when
// it is gone, also when a DELETE that waited for another deleter raised 40001
// under REPEATABLE READ or SERIALIZABLE (READ COMMITTED gets no row).
bool delete_row_version(OwnerSpi &spi, const KeyRef &key,
                        const KeyProbe &version) {
  Oid types[4] = {TIDOID, XIDOID, cache.scope_type, BYTEAOID};
  Datum values[4] = {PointerGetDatum(&version.tid),
                     TransactionIdGetDatum(version.xmin),
                     ObjectIdGetDatum(key.scope), PointerGetDatum(key.digest)};
  auto run = [&] {
    spi.run_kept(
        cache.delete_version,
        cache.delete_version.plan == nullptr ? delete_version_sql() : nullptr,
        4, types, values, nullptr, false, SPI_OK_DELETE, GetLatestSnapshot());
    return SPI_processed > 0;
  };
  if (!IsolationUsesXactSnapshot())
    return run();
  auto gone_now = [&](const ErrorData *error) {
    if (error->sqlerrcode != ERRCODE_T_R_SERIALIZATION_FAILURE)
      return false;
    spi.run_kept(cache.version_exists,
                 "SELECT FROM idempotency.keys AS k"
                 " WHERE k.ctid OPERATOR(pg_catalog.=) $1"
                 " AND k.xmin OPERATOR(pg_catalog.=) $2",
                 2, types, values, nullptr, true, SPI_OK_SELECT,
                 GetLatestSnapshot());
    return SPI_processed == 0;
  };
  bool deleted = false;
  run_in_subtransaction([&] { deleted = run(); }, gone_now);
  return deleted;
}

// The TTL counts from the write (fn may have run long); the window after it is
// fixed now as exact time, so callers and expiry end it at one instant.
StoredRow insert_key_row(OwnerSpi &spi, const KeyRef &key, const NewRow &row) {
  TimestampTz created_at = GetCurrentTimestamp();
  TimestampTz expires_at = settings::key_expiry(created_at, row.ttl);
  bool window_isnull = false;
  Datum window = stored_window(
      settings::remember_usecs(expires_at, row.remember), &window_isnull);
  Oid types[insert_key_args] = {cache.scope_type, TEXTOID,    BYTEAOID,
                                BYTEAOID,         JSONBOID,   TIMESTAMPTZOID,
                                TIMESTAMPTZOID,   INTERVALOID};
  Datum values[insert_key_args] = {ObjectIdGetDatum(key.scope),
                                   PointerGetDatum(key.key),
                                   PointerGetDatum(key.digest),
                                   PointerGetDatum(row.request_hash),
                                   row.response,
                                   TimestampTzGetDatum(created_at),
                                   TimestampTzGetDatum(expires_at),
                                   window};
  char nulls[insert_key_args + 1] = "        ";
  if (row.response_is_null)
    nulls[4] = 'n';
  if (window_isnull)
    nulls[7] = 'n';
  // Unless a trigger may change it, the row is as written, not read back.
  bool returning = cache.rows_may_change;
  KeptPlan &kept = returning ? cache.insert_key_returning : cache.insert_key;
  run_own_insert(spi, kept,
                 kept.plan == nullptr ? insert_key_sql(returning) : nullptr,
                 insert_key_args, types, values, nulls,
                 OwnInsert{0, false, key.scope, key.digest},
                 returning ? SPI_OK_INSERT_RETURNING : SPI_OK_INSERT);
  if (!returning)
    return StoredRow{created_at, expires_at};
  if (SPI_processed == 0)
    check_key_row_kept(TriggeredRow::skipped, "idempotency.keys",
                       "scope, key or key_digest", key.key);
  HeapTuple inserted = SPI_tuptable->vals[0];
  TupleDesc desc = SPI_tuptable->tupdesc;
  check_not_moved(inserted, desc, key.scope, key.digest, key.key);
  bool isnull = false;
  return StoredRow{
      DatumGetTimestampTz(SPI_getbinval(inserted, desc, 4, &isnull)),
      DatumGetTimestampTz(SPI_getbinval(inserted, desc, 5, &isnull))};
}

// Writes, as one INSERT (statement triggers fire once), the tombstones of the
// rows expiry deleted (`deleted`, delete_expired_sql()'s columns) whose keys
// callers remember past `cutoff` (live_row_forgotten_at).
void insert_tombstones(OwnerSpi &spi, const SPITupleTable *deleted,
                       uint64 count, TimestampTz cutoff) {
  const KeyColumns &columns = cache.columns;
  if (columns.expired_at == InvalidAttrNumber)
    return;
  constexpr int arrays = 7; // in insert_tombstones_sql()'s order
  const Oid element_types[arrays] = {
      cache.scope_type, BYTEAOID,       BYTEAOID,   TIMESTAMPTZOID,
      TIMESTAMPTZOID,   TIMESTAMPTZOID, INTERVALOID};
  ArrayBuildState *built[arrays];
  for (int a = 0; a < arrays; a++)
    built[a] = initArrayResult(element_types[a], CurrentMemoryContext, false);
  auto add = [&](int a, Datum value, bool isnull) {
    accumArrayResult(built[a], value, isnull, element_types[a],
                     CurrentMemoryContext);
  };
  enum { expires_at = 5, expired_at, window };
  TupleDesc desc = deleted->tupdesc;
  for (uint64 i = 0; i < count; i++) {
    HeapTuple row = deleted->vals[i];
    bool isnull = false;
    (void)SPI_getbinval(row, desc, expired_at, &isnull);
    if (!isnull)
      continue; // a tombstone past its window
    TimestampTz response_expired_at =
        DatumGetTimestampTz(SPI_getbinval(row, desc, expires_at, &isnull));
    RememberWindow remembered =
        remember_window(columns, [&](AttrNumber, bool *null) {
          return SPI_getbinval(row, desc, window, null);
        });
    TimestampTz forgotten_at =
        live_row_forgotten_at(remembered, response_expired_at);
    if (forgotten_at <= cutoff)
      continue;
    // scope, key_digest, request_hash and created_at, as they were
    for (int a = 0; a < 4; a++)
      add(a, SPI_getbinval(row, desc, a + 1, &isnull), isnull);
    add(4, TimestampTzGetDatum(forgotten_at), false);
    add(5, TimestampTzGetDatum(response_expired_at), false);
    Datum span = stored_window(forgotten_at - response_expired_at, &isnull);
    add(6, span, isnull);
  }
  int remembered = built[0]->nelems;
  if (remembered == 0)
    return;
  Oid types[arrays];
  Datum values[arrays];
  for (int a = 0; a < arrays; a++) {
    types[a] = get_array_type(element_types[a]);
    values[a] = makeArrayResult(built[a], CurrentMemoryContext);
  }
  run_own_insert(
      spi, cache.insert_tombstones,
      cache.insert_tombstones.plan == nullptr ? insert_tombstones_sql()
                                              : nullptr,
      arrays, types, values, nullptr, OwnInsert{0, true, InvalidOid, nullptr},
      SPI_OK_INSERT_RETURNING);
  text *empty_key = cstring_to_text("");
  if (SPI_processed < (uint64)remembered)
    check_key_row_kept(TriggeredRow::skipped, "idempotency.keys",
                       "scope, key or key_digest", empty_key);
  for (int i = 0; i < remembered; i++)
    check_not_moved(SPI_tuptable->vals[i], SPI_tuptable->tupdesc,
                    DatumGetObjectId(built[0]->dvalues[i]),
                    DatumGetByteaPP(built[1]->dvalues[i]), empty_key);
}

// A round's progress: each pass goes on after the last entry read; B-tree keeps
// equal expires_at entries in heap order, so the row address tells them apart.
struct LocalExpiry {
  bool positioned;        // the last entry read:
  TimestampTz expires_at; // its key
  ItemPointerData tid;    // and its row
  ItemPointerData *tids;  // the pass's rows, sorted in heap order
  int count;
  int next; // tids[next ...] are still to be deleted
};
static_assert(std::is_trivially_destructible_v<LocalExpiry>);

// Passes keep 6-byte row addresses only: large passes keep a round's scans few.
constexpr int min_keys_per_pass = 100000;

// The index must order expires_at as timestamptz (the scan keys compare so), in
// the extension's own family, which no caller's query plan uses: with the
// default one, EXPLAIN ANALYZE could count other roles' keys by expiry time.
Relation open_expires_at_index(Relation table) {
  Oid index = schema::relation("keys_expires_at_idx");
  Relation rel =
      OidIsValid(index) ? index_open(index, AccessShareLock) : nullptr;
  if (rel == nullptr || rel->rd_index->indrelid != table->rd_id ||
      rel->rd_index->indkey.values[0] != key_columns(table).expires_at ||
      rel->rd_rel->relam != BTREE_AM_OID ||
      rel->rd_opfamily[0] !=
          GetSysCacheOid3(OPFAMILYAMNAMENSP, Anum_pg_opfamily_oid,
                          ObjectIdGetDatum(BTREE_AM_OID),
                          CStringGetDatum("expiry_ops"),
                          ObjectIdGetDatum(get_rel_namespace(index))))
    ereport(ERROR,
            (errcode(ERRCODE_UNDEFINED_OBJECT),
             errmsg("index idempotency.keys_expires_at_idx on idempotency.keys "
                    "(expires_at idempotency.expiry_ops) does not exist"),
             errhint("Recreate it with CREATE INDEX keys_expires_at_idx ON "
                     "idempotency.keys (expires_at idempotency.expiry_ops).")));
  return rel;
}

// Collects up to `limit` expired keys after the last entry read, visible to
// the active snapshot; false while expired keys are left after them.
bool collect_pass(const ExpiryRound &round, LocalExpiry &expiry, int limit) {
  Relation table = table_open(key_table().relid, AccessShareLock);
  Relation index = open_expires_at_index(table);

  ScanKeyData scan_keys[2];
  int nkeys = 0;
  ScanKeyInit(&scan_keys[nkeys++], 1, BTLessEqualStrategyNumber,
              F_TIMESTAMPTZ_LE, TimestampTzGetDatum(round.cutoff));
  if (expiry.positioned)
    ScanKeyInit(&scan_keys[nkeys++], 1, BTGreaterEqualStrategyNumber,
                F_TIMESTAMPTZ_GE, TimestampTzGetDatum(expiry.expires_at));
  IndexScanDesc scan = compat::index_beginscan(
      table, index, GetActiveSnapshot(), nullptr, nkeys, 0, compat::SO_NONE);
  // The index tuple tells entries read before apart without a heap visit.
  scan->xs_want_itup = true;
  index_rescan(scan, scan_keys, nkeys, nullptr, 0);
  TupleTableSlot *slot = table_slot_create(table, nullptr);

  int capacity = std::min(limit, 1024);
  if (expiry.tids != nullptr)
    pfree(expiry.tids);
  expiry.tids = static_cast<ItemPointerData *>(
      MemoryContextAlloc(round.context, capacity * sizeof(ItemPointerData)));
  expiry.count = 0;
  expiry.next = 0;
  bool finished = true;
  ItemPointer tid;
  while ((tid = index_getnext_tid(scan, ForwardScanDirection)) != nullptr) {
    CHECK_FOR_INTERRUPTS();
    bool isnull = false;
    TimestampTz expires_at = DatumGetTimestampTz(
        index_getattr(scan->xs_itup, 1, scan->xs_itupdesc, &isnull));
    if (expiry.positioned && expires_at == expiry.expires_at &&
        ItemPointerCompare(tid, &expiry.tid) <= 0)
      continue; // read by an earlier pass
    if (expiry.count == limit) {
      finished = false;
      break;
    }
    expiry.positioned = true;
    expiry.expires_at = expires_at;
    expiry.tid = *tid;
    if (!index_fetch_heap(scan, slot))
      continue;
    if (expiry.count == capacity) {
      capacity = std::min(limit, capacity * 2);
      expiry.tids = static_cast<ItemPointerData *>(
          repalloc(expiry.tids, capacity * sizeof(ItemPointerData)));
    }
    expiry.tids[expiry.count++] = slot->tts_tid;
  }

  ExecDropSingleTupleTableSlot(slot);
  index_endscan(scan);
  index_close(index, NoLock);
  table_close(table, NoLock);

  // Deleting in heap order dirties each page once per batch.
  std::sort(expiry.tids, expiry.tids + expiry.count,
            [](const ItemPointerData &a, const ItemPointerData &b) {
              return ItemPointerCompare(const_cast<ItemPointer>(&a),
                                        const_cast<ItemPointer>(&b)) < 0;
            });
  return finished;
}

// Deletes what delete_expired_sql() selects of `tids`, writing the tombstones
// of those still remembered; returns how many it deleted.
int64 delete_expired(TimestampTz cutoff, const ItemPointerData *tids,
                     int count) {
  OwnerSpi spi = begin_statements(key_table().relid, nullptr);
  auto *elements = static_cast<Datum *>(palloc(count * sizeof(Datum)));
  for (int i = 0; i < count; i++)
    elements[i] = PointerGetDatum(&tids[i]);
  ArrayType *array = construct_array(
      elements, count, TIDOID, sizeof(ItemPointerData), false, TYPALIGN_SHORT);
  Oid types[2] = {TIDARRAYOID, TIMESTAMPTZOID};
  Datum values[2] = {PointerGetDatum(array), TimestampTzGetDatum(cutoff)};
  spi.run_kept(cache.delete_expired,
               cache.delete_expired.plan == nullptr ? delete_expired_sql()
                                                    : nullptr,
               2, types, values, nullptr, false, SPI_OK_DELETE_RETURNING);
  uint64 deleted = SPI_processed;
  insert_tombstones(spi, SPI_tuptable, deleted, cutoff);
  end_statements(spi);
  return (int64)deleted;
}

// An error writing a row's tombstone is the row's (a DBA's constraint,
// index or trigger refused it) unless it is a transient condition (a lock
// timeout, a cancel, ...), which ends the batch and the round.
bool refused_row(const ErrorData *error) {
  return !sqlstate_transient(unpack_sql_state(error->sqlerrcode));
}

LocalExpiry &progress_of(ExpiryRound &round) {
  if (round.progress == nullptr)
    round.progress = MemoryContextAllocZero(round.context, sizeof(LocalExpiry));
  return *static_cast<LocalExpiry *>(round.progress);
}

} // namespace

bool is_own_insert(Relation rel, HeapTuple row) {
  if (own_insert.transaction != compat::my_local_transaction_id() ||
      own_insert.transaction == InvalidLocalTransactionId ||
      RelationGetRelid(rel) != cache.relid)
    return false;
  const KeyColumns &columns = cache.columns;
  TupleDesc desc = RelationGetDescr(rel);
  bool isnull = true;
  if (own_insert.tombstones) {
    if (columns.expired_at != InvalidAttrNumber)
      (void)heap_getattr(row, columns.expired_at, desc, &isnull);
    return !isnull;
  }
  Datum scope = heap_getattr(row, columns.scope, desc, &isnull);
  if (isnull || DatumGetObjectId(scope) != own_insert.scope)
    return false;
  Datum digest = heap_getattr(row, columns.key_digest, desc, &isnull);
  return !isnull &&
         datum_image_eq(digest, PointerGetDatum(own_insert.digest), false, -1);
}

StoredRow KeyStore::store(const KeyRef &key, const NewRow &row) const {
  if (kind_ == KeyTableKind::tenant)
    return tenant_keys::store(table_, key, row);
  OwnerSpi spi = begin_statements(table_.relid, &key);
  // Only expiry changes a claimed key's row: deleted (nothing to do) or made a
  // tombstone, removed too if its window passed by row.judged_at, else 40001.
  if (row.replaces != nullptr && !delete_row_version(spi, key, *row.replaces)) {
    KeyProbe later = probe(key, row.judged_at);
    if (later.state != KeyState::absent &&
        (later.state != KeyState::expired ||
         !delete_row_version(spi, key, later)))
      report_replaced_row_changed();
  }
  StoredRow stored = insert_key_row(spi, key, row);
  end_statements(spi);

  commit_guard::note_key_written(stored.expires_at);
  citus::note_key_write();
  return stored;
}

bool KeyStore::remove(const KeyRef &key, const KeyProbe &stored) const {
  if (kind_ == KeyTableKind::tenant)
    return tenant_keys::remove(table_, key, stored);
  OwnerSpi spi = begin_statements(table_.relid, nullptr);
  bool deleted = delete_row_version(spi, key, stored);
  end_statements(spi);
  if (deleted)
    citus::note_key_write();
  return deleted;
}

bool lock_key_table(LOCKMODE mode) {
  Oid table = schema::relation("keys");
  if (!OidIsValid(table))
    return false;
  LockRelationOid(table, mode);
  // A drop that committed while this waited for the lock took the table.
  return SearchSysCacheExists1(RELOID, ObjectIdGetDatum(table));
}

// Expiry walks keys_expires_at_idx up to the cutoff in passes, then deletes
// what a pass collected a batch at a time. It takes no claim and waits for no
// one: a row another transaction has locked is left for a later round.
void KeyStore::collect_expired(ExpiryRound &round, int batch_size) const {
  if (kind_ == KeyTableKind::tenant) {
    tenant_keys::collect_expired(round, batch_size);
    return;
  }
  LocalExpiry &expiry = progress_of(round);
  round.finished =
      collect_pass(round, expiry, std::max(batch_size, min_keys_per_pass));
  round.has_batch = expiry.count > 0;
  round.paced = true;
}

ExpiryBatch KeyStore::expire_batch(ExpiryRound &round, int batch_size) const {
  if (kind_ == KeyTableKind::tenant)
    return tenant_keys::expire_batch(round, batch_size);
  LocalExpiry &expiry = progress_of(round);
  int count = std::min(batch_size, expiry.count - expiry.next);
  const ItemPointerData *tids = expiry.tids + expiry.next;
  TimestampTz cutoff = round.cutoff;
  int64 deleted = 0;
  // One subtransaction for the batch, or one per row if it fails: a row whose
  // tombstone is refused stays (deleting it would let a late retry run again),
  // judged by its times, and past its window goes without a tombstone.
  if (!run_in_subtransaction(
          [&] { deleted = delete_expired(cutoff, tids, count); },
          refused_row)) {
    deleted = 0;
    for (int i = 0; i < count; i++) {
      int64 row_deleted = 0;
      if (run_in_subtransaction(
              [&] { row_deleted = delete_expired(cutoff, &tids[i], 1); },
              [&](const ErrorData *error) {
                if (!refused_row(error))
                  return false;
                if (round.kept++ == 0)
                  round.kept_reason = MemoryContextStrdup(
                      round.context,
                      psprintf("%s: %s", unpack_sql_state(error->sqlerrcode),
                               error->message));
                return true;
              }))
        deleted += row_deleted;
    }
  }
  expiry.next += count;
  round.has_batch = expiry.next < expiry.count;
  return ExpiryBatch{deleted, count};
}

} // namespace idempotency::storage
