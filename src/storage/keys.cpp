#include "idempotency/storage/keys.hpp"

#include "idempotency/storage/citus.hpp"
#include "idempotency/storage/key_store.hpp"
#include "idempotency/storage/commit_guard.hpp"
#include "idempotency/storage/role_marks.hpp"
#include "idempotency/storage/row_insert.hpp"

#include "idempotency/settings/settings.hpp"

#include "idempotency/compat.hpp"

extern "C" {
#include "access/genam.h"
#include "access/table.h"
#include "access/tableam.h"
#include "access/xact.h"
#include "storage/bufmgr.h"
#include "utils/rel.h"
#include "catalog/pg_collation.h"
#include "common/int.h"
#include "catalog/pg_proc.h"
#include "catalog/pg_type.h"
#include "executor/executor.h"
#include "optimizer/optimizer.h"
#include "parser/parse_func.h"
#include "rewrite/rewriteHandler.h"
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
  pg_unreachable();
}

// --- what this backend knows about idempotency.keys -----------------------
//
// The table's oid, where our columns are, the default expressions of the
// columns a DBA added and whether Citus has taken the table over are looked
// up once and kept until an invalidation says the table (or a schema)
// changed. A table rebuilt by ALTER TABLE, VACUUM FULL or CLUSTER keeps its
// oid; its relcache entry is invalidated all the same, so the next call
// looks again. Citus invalidates the relcache entry of a table whenever it
// adds it to its metadata or removes it.

struct TableCache {
  bool relid_known;
  bool columns_known;
  bool citus_known;
  uint64 invalidations; // of the table, counted to spot one during a rebuild
  Oid relid;
  citus::TableKind citus_kind;
  KeyColumns columns;
  int default_count;
  DefaultColumn *defaults;
  Oid loader_function;   // idempotency.keys_loaded()
  MemoryContext context; // owns `defaults` and their expressions
};

TableCache cache;

void forget_relation(Datum, Oid relid) {
  if (relid == InvalidOid || relid == cache.relid) {
    cache.relid_known = false;
    cache.columns_known = false;
    cache.citus_known = false;
    cache.invalidations++;
  }
}

// A renamed or dropped schema may change what "idempotency.keys" names.
void forget_namespaces(Datum, compat::SysCacheIdentifier, uint32) {
  cache.relid_known = false;
}

void watch_invalidations() {
  static bool watching = false;
  if (watching)
    return;
  CacheRegisterRelcacheCallback(forget_relation, (Datum)0);
  CacheRegisterSyscacheCallback(NAMESPACEOID, forget_namespaces, (Datum)0);
  watching = true;
}

Oid keys_table_oid() {
  Oid table = schema::relation("keys");
  if (!OidIsValid(table))
    report_missing_table();
  return table;
}

// --- the extension's columns ------------------------------------------------

struct ExpectedColumn {
  const char *name;
  Oid type; // InvalidOid: scope, see fits_scope()
  AttrNumber KeyColumns::*field;
};

constexpr ExpectedColumn expected_columns[] = {
    {"scope", InvalidOid, &KeyColumns::scope},
    {"key", TEXTOID, &KeyColumns::key},
    {"key_digest", BYTEAOID, &KeyColumns::key_digest},
    {"request_hash", BYTEAOID, &KeyColumns::request_hash},
    {"response", JSONBOID, &KeyColumns::response},
    {"created_at", TIMESTAMPTZOID, &KeyColumns::created_at},
    {"expires_at", TIMESTAMPTZOID, &KeyColumns::expires_at},
};

// The C function of the trigger keys_loaded (protocol/loaded_rows.hpp),
// which fixes rows that COPY or INSERT load; InvalidOid when there is none.
Oid loader_function() {
  List *name = list_make2(makeString(pstrdup("idempotency")),
                          makeString(pstrdup("keys_loaded")));
  return LookupFuncName(name, 0, nullptr, true);
}

// The C function of keys_loaded() from 0.7 on (entry/functions.cpp): it
// computes the digests 0.7 and later store.
constexpr const char *current_loader_symbol = "idempotency_ordered_keys_loaded";

// The library serves the table as 0.7 and later make it. Before 0.7 the
// primary key held other digests: none before 0.4 (it was on the key's
// text, and request_hash was hex text), then every key's unordered digest
// (over the database encoding in 0.4 and 0.5). Those tables are told apart
// by what they have: a key_digest column, and a loader trigger whose C
// function computes the digests 0.7 stores.
bool holds_current_digests(TupleDesc desc, Oid loader) {
  if (find_column(desc, "key_digest") == nullptr || !OidIsValid(loader))
    return false;
  HeapTuple proc = SearchSysCache1(PROCOID, ObjectIdGetDatum(loader));
  if (!HeapTupleIsValid(proc))
    return false;
  bool isnull;
  Datum symbol = SysCacheGetAttr(PROCOID, proc, Anum_pg_proc_prosrc, &isnull);
  bool current = !isnull && strcmp(TextDatumGetCString(symbol),
                                   current_loader_symbol) == 0;
  ReleaseSysCache(proc);
  return current;
}

// expired_at, which 1.0 added: the table of 0.7, before its update, has
// none and keeps no tombstones.
AttrNumber locate_expired_at(TupleDesc desc) {
  Form_pg_attribute attribute = find_column(desc, "expired_at");
  if (attribute == nullptr)
    return InvalidAttrNumber;
  if (attribute->atttypid != TIMESTAMPTZOID || attribute->attgenerated != '\0')
    ereport(ERROR,
            (errcode(ERRCODE_DATATYPE_MISMATCH),
             errmsg("column \"expired_at\" of idempotency.keys has type %s, "
                    "which idempotent_call cannot store",
                    format_type_be(attribute->atttypid)),
             errdetail("idempotent_call stores timestamp with time zone in "
                       "this column, unchanged and not generated."),
             errhint("Change the column back with ALTER TABLE "
                     "idempotency.keys ALTER COLUMN expired_at TYPE "
                     "timestamptz.")));
  return attribute->attnum;
}

// remember_for, which 1.1 added: the tables of 1.0 and 0.7, before their
// update, have none and are judged as 1.0 judged them.
AttrNumber locate_remember_for(TupleDesc desc) {
  Form_pg_attribute attribute = find_column(desc, "remember_for");
  if (attribute == nullptr)
    return InvalidAttrNumber;
  if (attribute->atttypid != INTERVALOID || attribute->attgenerated != '\0')
    ereport(ERROR,
            (errcode(ERRCODE_DATATYPE_MISMATCH),
             errmsg("column \"remember_for\" of idempotency.keys has type %s, "
                    "which idempotent_call cannot store",
                    format_type_be(attribute->atttypid)),
             errdetail("idempotent_call stores interval in this column, "
                       "unchanged and not generated."),
             errhint("Change the column back with ALTER TABLE "
                     "idempotency.keys ALTER COLUMN remember_for TYPE "
                     "interval.")));
  return attribute->attnum;
}

// Refuses a table whose columns the extension could not read or write
// correctly: a value stored under another type would be misread later.
KeyColumns locate_columns(Relation rel, Oid loader) {
  TupleDesc desc = RelationGetDescr(rel);
  if (!holds_current_digests(desc, loader))
    report_schema_before_0_7();
  KeyColumns columns{};
  for (ExpectedColumn expected : expected_columns) {
    Form_pg_attribute attribute = find_column(desc, expected.name);
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
  columns.expired_at = locate_expired_at(desc);
  columns.remember_for = locate_remember_for(desc);
  return columns;
}

bool is_ours(const KeyColumns &columns, AttrNumber attnum) {
  if (attnum == InvalidAttrNumber)
    return false;
  for (const ExpectedColumn &expected : expected_columns)
    if (columns.*expected.field == attnum)
      return true;
  return columns.expired_at == attnum || columns.remember_for == attnum;
}

bool is_ours_column(const void *columns, AttrNumber attnum) {
  return is_ours(*static_cast<const KeyColumns *>(columns), attnum);
}

// Replaces the cached columns. The old memory context may still be in use
// by a store further up the stack (a trigger or default that calls
// idempotent_call): it lives until the transaction ends. The catalog
// lookups below may take in invalidations; if one concerns the table, what
// was built serves this call and the next one looks again.
void remember_columns(Relation rel) {
  uint64 invalidations = cache.invalidations;
  Oid loader = loader_function();
  KeyColumns columns = locate_columns(rel, loader);
  if (cache.context != nullptr)
    MemoryContextSetParent(cache.context, TopTransactionContext);
  cache.context = AllocSetContextCreate(
      CacheMemoryContext, "idempotency keys table", ALLOCSET_SMALL_SIZES);
  MemoryContext previous = MemoryContextSwitchTo(cache.context);
  cache.default_count =
      plan_defaults(rel, is_ours_column, &columns, &cache.defaults);
  MemoryContextSwitchTo(previous);
  cache.loader_function = loader;
  cache.columns = columns;
  if (cache.relid != RelationGetRelid(rel))
    cache.citus_known = false;
  cache.relid = RelationGetRelid(rel);
  cache.columns_known = cache.invalidations == invalidations;
}

void remember_relid(Oid relid) {
  if (relid != cache.relid) {
    cache.columns_known = false;
    cache.citus_known = false;
  }
  cache.relid = relid;
  cache.relid_known = true;
}

// Whether Citus has taken the cached table over. The lookup may take in
// invalidations; if one concerns the table, the answer serves this call
// and the next one looks again.
citus::TableKind cached_citus_kind() {
  if (cache.citus_known)
    return cache.citus_kind;
  uint64 invalidations = cache.invalidations;
  citus::TableKind kind = citus::table_kind(cache.relid);
  cache.citus_kind = kind;
  cache.citus_known = cache.invalidations == invalidations;
  return kind;
}

void refuse_citus_table() {
  citus::TableKind kind = cached_citus_kind();
  if (kind != citus::TableKind::not_citus)
    citus::report_citus_table(kind);
}

} // namespace

namespace {

// A stored span as exact time, as intervals compare (a day 24 hours, a
// month 30 days): the same instant for every reader.
int64 exact_usecs(const Interval &span) {
  int64 usecs = span.time;
  int64 days = (int64)span.month * DAYS_PER_MONTH + span.day;
  if (pg_mul_s64_overflow(days, USECS_PER_DAY, &days) ||
      pg_add_s64_overflow(usecs, days, &usecs))
    return span.time < 0 || days < 0 ? 0 : PG_INT64_MAX;
  return Max(usecs, 0);
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
  pg_unreachable();
}

KeyTable key_table() {
  watch_invalidations();
  if (!cache.relid_known)
    remember_relid(keys_table_oid());
  refuse_citus_table();
  return KeyTable{cache.relid, InvalidOid, InvalidOid};
}

citus::TableKind key_table_citus_kind() {
  watch_invalidations();
  if (!cache.relid_known) {
    Oid relid = schema::relation("keys");
    if (!OidIsValid(relid))
      return citus::TableKind::not_citus;
    remember_relid(relid);
  }
  return cached_citus_kind();
}

// Checked again with the table open: a conversion by Citus that committed
// while this transaction waited for the table's lock arrives with the lock.
const KeyColumns &key_columns(Relation rel) {
  watch_invalidations();
  if (!cache.columns_known || cache.relid != RelationGetRelid(rel))
    remember_columns(rel);
  refuse_citus_table();
  return cache.columns;
}

// --- reading ----------------------------------------------------------------

namespace {

Datum copy_varlena(HeapTuple tuple, AttrNumber attnum, TupleDesc desc,
                   bool *isnull) {
  Datum value = heap_getattr(tuple, attnum, desc, isnull);
  if (*isnull)
    return (Datum)0;
  return PointerGetDatum(PG_DETOAST_DATUM_COPY(value));
}

// Under REPEATABLE READ and SERIALIZABLE a replay must not hand out a row
// this transaction's snapshot cannot see; PostgreSQL's ON CONFLICT raises a
// serialization failure in the same situation.
void check_visible_to_snapshot(Relation rel, SysScanDesc scan,
                               HeapTuple tuple) {
  if (!IsolationUsesXactSnapshot())
    return;
  TransactionId xmin = HeapTupleHeaderGetXmin(tuple->t_data);
  if (TransactionIdIsCurrentTransactionId(xmin))
    return;
  if (!table_tuple_satisfies_snapshot(rel, scan->slot,
                                      GetTransactionSnapshot()))
    ereport(ERROR,
            (errcode(ERRCODE_T_R_SERIALIZATION_FAILURE),
             errmsg("could not serialize access due to concurrent update"),
             errdetail("The idempotency key was stored by a transaction that "
                       "committed after this transaction's snapshot.")));
}

bool is_tombstone(Relation rel, const KeyColumns &columns, HeapTuple tuple) {
  if (columns.expired_at == InvalidAttrNumber)
    return false;
  bool isnull = true;
  (void)heap_getattr(tuple, columns.expired_at, RelationGetDescr(rel), &isnull);
  return !isnull;
}

RowLife row_times(Relation rel, const KeyColumns &columns, HeapTuple tuple,
                  bool tombstone, TimestampTz now) {
  TupleDesc desc = RelationGetDescr(rel);
  bool isnull = false;
  TimestampTz expires_at = DatumGetTimestampTz(
      heap_getattr(tuple, columns.expires_at, desc, &isnull));
  TimestampTz expired_at =
      tombstone ? DatumGetTimestampTz(
                      heap_getattr(tuple, columns.expired_at, desc, &isnull))
                : 0;
  RememberWindow window{};
  if (!tombstone && expires_at <= now)
    window = remember_window(columns, [&](AttrNumber attnum, bool *null) {
      return heap_getattr(tuple, attnum, desc, null);
    });
  return row_life(tombstone, window, expires_at, expired_at, now);
}

void read_times(Relation rel, const KeyColumns &columns, HeapTuple tuple,
                KeyProbe &result) {
  TupleDesc desc = RelationGetDescr(rel);
  bool isnull = false;
  result.created_at = DatumGetTimestampTz(
      heap_getattr(tuple, columns.created_at, desc, &isnull));
  result.expires_at = DatumGetTimestampTz(
      heap_getattr(tuple, columns.expires_at, desc, &isnull));
}

RowVersion row_version(HeapTuple tuple) {
  return RowVersion{tuple->t_self, HeapTupleHeaderGetRawXmin(tuple->t_data)};
}

KeyProbe expired_row(Relation rel, const KeyColumns &columns, HeapTuple tuple) {
  KeyProbe result{};
  result.state = KeyState::expired;
  result.row = row_version(tuple);
  read_times(rel, columns, tuple, result);
  return result;
}

KeyProbe done_row(Relation rel, const KeyColumns &columns, SysScanDesc scan,
                  HeapTuple tuple) {
  check_visible_to_snapshot(rel, scan, tuple);
  KeyProbe result{};
  TupleDesc desc = RelationGetDescr(rel);
  bool isnull = false;
  result.state = KeyState::done;
  result.row = row_version(tuple);
  read_times(rel, columns, tuple, result);
  result.request_hash = reinterpret_cast<bytea *>(DatumGetPointer(
      copy_varlena(tuple, columns.request_hash, desc, &isnull)));
  result.response =
      copy_varlena(tuple, columns.response, desc, &result.response_is_null);
  return result;
}

// The fingerprint is kept until the key is forgotten, and its retry is
// refused by times alone: a tombstone that expiry is writing (or a row it
// is turning into one) answers as the committed one will, and under
// REPEATABLE READ the tombstone written after the snapshot stands for the
// live row the snapshot saw.
KeyProbe gone_row(Relation rel, const KeyColumns &columns, HeapTuple tuple,
                  const RowLife &times) {
  KeyProbe result{};
  TupleDesc desc = RelationGetDescr(rel);
  bool isnull = false;
  result.state = KeyState::gone;
  result.row = row_version(tuple);
  result.created_at = DatumGetTimestampTz(
      heap_getattr(tuple, columns.created_at, desc, &isnull));
  result.expires_at = times.forgotten_at;
  result.response_expired_at = times.response_expired_at;
  result.request_hash = reinterpret_cast<bytea *>(DatumGetPointer(
      copy_varlena(tuple, columns.request_hash, desc, &isnull)));
  result.response_is_null = true;
  return result;
}

KeyProbe in_progress(TransactionId holder) {
  KeyProbe result{};
  result.state = KeyState::in_progress;
  result.holder = holder;
  return result;
}

} // namespace

namespace {

bool same_key(Relation rel, const KeyColumns &columns, HeapTuple tuple,
              const text *key) {
  bool isnull = false;
  Datum stored =
      heap_getattr(tuple, columns.key, RelationGetDescr(rel), &isnull);
  return !isnull && datum_image_eq(stored, PointerGetDatum(key), false, -1);
}

} // namespace

const LocalKeys local_keys{};

KeyProbe LocalKeys::probe(const KeyTable &table, const KeyRef &key,
                          TimestampTz now) const {
  Relation rel = table_open(table.relid, AccessShareLock);
  KeyColumns columns = key_columns(rel);

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
  while ((tuple = systable_getnext(scan)) != nullptr) {
    // A tombstone keeps no key text: the digest is the key.
    bool tombstone = is_tombstone(rel, columns, tuple);
    if (!tombstone && !same_key(rel, columns, tuple, key.key))
      report_shared_digest();
    // The dirty snapshot reports an open inserter in xmin and an open
    // deleter in xmax. A live row being inserted means another transaction
    // holds the key right now; a tombstone being inserted is expiry's (or a
    // restore's), and is judged by its times.
    if (TransactionIdIsValid(dirty.xmin) && !tombstone) {
      result = in_progress(dirty.xmin);
      break;
    }
    RowLife times = row_times(rel, columns, tuple, tombstone, now);
    // A row whose response expired being deleted - by expiry (which may be
    // writing its tombstone), or by a caller replacing it (who holds the
    // key's claim and shows its new row) - is judged by its times; store()
    // waits for that delete to end. A live row being deleted is another
    // transaction's business: wait.
    if (TransactionIdIsValid(dirty.xmax) && times.age == RowAge::live) {
      result = in_progress(dirty.xmax);
      break;
    }
    if (times.age == RowAge::forgotten) {
      result = expired_row(rel, columns, tuple);
      result.expires_at = times.forgotten_at;
      continue; // the key's new row, if any, may come next
    }
    if (times.age == RowAge::gone) {
      result = gone_row(rel, columns, tuple, times);
      break;
    }
    result = done_row(rel, columns, scan, tuple);
    break;
  }

  systable_endscan(scan);
  table_close(rel, NoLock);
  return result;
}

// --- writing ----------------------------------------------------------------

[[noreturn]] void report_replaced_row_changed() {
  ereport(ERROR, (errcode(ERRCODE_T_R_SERIALIZATION_FAILURE),
                  errmsg("could not serialize access due to concurrent update"),
                  errdetail("An expired idempotency key was changed while "
                            "being replaced.")));
  pg_unreachable();
}

namespace {

// Whether `tuple` is a row of `key`: its scope and digest (the probe that
// found the row compared the key's text). Reads only values kept in the
// row, never out of line: the caller holds the page's lock.
bool is_key_row(Relation rel, const KeyColumns &columns, HeapTuple tuple,
                const KeyRef &key) {
  TupleDesc desc = RelationGetDescr(rel);
  bool isnull = false;
  Datum scope = heap_getattr(tuple, columns.scope, desc, &isnull);
  if (isnull || DatumGetObjectId(scope) != key.scope)
    return false;
  Datum stored = heap_getattr(tuple, columns.key_digest, desc, &isnull);
  if (isnull || VARATT_IS_EXTERNAL(DatumGetPointer(stored)) ||
      VARATT_IS_COMPRESSED(DatumGetPointer(stored)))
    return false; // never so for a digest
  return datum_image_eq(stored, PointerGetDatum(key.digest), false, -1);
}

// Pins the page of `version` if it still holds that row version of `key`;
// InvalidBuffer when it does not (expiry deleted the row and vacuum freed or
// reused its slot). While the page is pinned the row cannot be pruned, so
// its slot keeps that row until the caller releases the pin.
Buffer pin_row_version(Relation rel, const KeyColumns &columns,
                       const KeyRef &key, const RowVersion &version) {
  // The block is still there: the probe that found the row, in this
  // transaction, has held the table's lock since, and vacuum truncates only
  // under ACCESS EXCLUSIVE.
  Buffer buffer = ReadBuffer(rel, ItemPointerGetBlockNumber(&version.tid));
  LockBuffer(buffer, BUFFER_LOCK_SHARE);
  Page page = BufferGetPage(buffer);
  OffsetNumber offset = ItemPointerGetOffsetNumber(&version.tid);
  bool same = false;
  if (offset >= FirstOffsetNumber && offset <= PageGetMaxOffsetNumber(page)) {
    ItemId item = PageGetItemId(page, offset);
    if (ItemIdIsNormal(item)) {
      HeapTupleData tuple;
      tuple.t_data = reinterpret_cast<HeapTupleHeader>(PageGetItem(page, item));
      tuple.t_len = ItemIdGetLength(item);
      tuple.t_self = version.tid;
      tuple.t_tableOid = RelationGetRelid(rel);
      same = HeapTupleHeaderGetRawXmin(tuple.t_data) == version.xmin &&
             is_key_row(rel, columns, &tuple, key);
    }
  }
  LockBuffer(buffer, BUFFER_LOCK_UNLOCK);
  if (same)
    return buffer;
  ReleaseBuffer(buffer);
  return InvalidBuffer;
}

enum class RowDeleted { deleted, already_gone, changed };

// Deletes the row version `version` of `key` as probe() found it. A row
// that expiry deleted meanwhile (committed, or waited for) is already_gone;
// changed means another transaction updated or locked it.
RowDeleted delete_row_version(Relation rel, const KeyColumns &columns,
                              const KeyRef &key, const RowVersion &version) {
  Buffer pinned = pin_row_version(rel, columns, key, version);
  if (!BufferIsValid(pinned))
    return RowDeleted::already_gone;
  TM_FailureData failure;
  TM_Result result = compat::table_tuple_delete(
      rel, const_cast<ItemPointer>(&version.tid), GetCurrentCommandId(true),
      0 /* options */, GetActiveSnapshot(), InvalidSnapshot, true /* wait */,
      &failure);
  ReleaseBuffer(pinned);
  switch (result) {
  case TM_Ok:
    return RowDeleted::deleted;
  case TM_Deleted:
    return RowDeleted::already_gone;
  default:
    return RowDeleted::changed;
  }
}

// Removes the expired row the new one replaces. No caller changes a row
// whose key this transaction has claimed, but expiry may have deleted it
// meanwhile (then there is nothing to do) or turned it into a tombstone:
// that one is removed too when its window has passed by `now`, the instant
// the claim judged the key by; one whose window had not (its
// idempotency.remember differed) makes the call fail with 40001, and the
// retry gets IK410.
void delete_expired_row(const KeyTable &table, Relation rel,
                        const KeyColumns &columns, const KeyRef &key,
                        const RowVersion &version, TimestampTz now) {
  RowDeleted result = delete_row_version(rel, columns, key, version);
  if (result == RowDeleted::deleted)
    return;
  if (result == RowDeleted::changed)
    report_replaced_row_changed();
  KeyProbe later = local_keys.probe(table, key, now);
  if (later.state == KeyState::absent)
    return;
  if (later.state != KeyState::expired ||
      delete_row_version(rel, columns, key, later.row) != RowDeleted::deleted)
    report_replaced_row_changed();
}

struct RowValues {
  const KeyRef *key;
  bytea *request_hash;
  Datum response;
  bool response_is_null;
  TimestampTz created_at;
  TimestampTz expires_at;
  TimestampTz expired_at; // a tombstone's; DT_NOBEGIN (NULL) for a live row
  int64 remember_usecs;   // remember_for, exact time
};

// Our columns get the call's values, the others their defaults.
void fill_row(const RowInsert &insert, const KeyColumns &columns,
              const RowValues &row) {
  TupleTableSlot *slot = insert.slot;
  clear_row(insert);
  auto set = [slot](AttrNumber attnum, Datum value, bool isnull) {
    slot->tts_values[attnum - 1] = value;
    slot->tts_isnull[attnum - 1] = isnull;
  };
  set(columns.scope, ObjectIdGetDatum(row.key->scope), false);
  set(columns.key, PointerGetDatum(row.key->key), false);
  set(columns.key_digest, PointerGetDatum(row.key->digest), false);
  set(columns.request_hash, PointerGetDatum(row.request_hash), false);
  set(columns.response, row.response, row.response_is_null);
  set(columns.created_at, TimestampTzGetDatum(row.created_at), false);
  set(columns.expires_at, TimestampTzGetDatum(row.expires_at), false);
  if (columns.expired_at != InvalidAttrNumber)
    set(columns.expired_at, TimestampTzGetDatum(row.expired_at),
        row.expired_at == DT_NOBEGIN);
  if (columns.remember_for != InvalidAttrNumber) {
    bool isnull = false;
    Datum window = stored_window(row.remember_usecs, &isnull);
    set(columns.remember_for, window, isnull);
  }

  evaluate_defaults(insert, cache.defaults, cache.default_count);
  ExecStoreVirtualTuple(slot);
}

// BEFORE row triggers may change the row, but not drop it or move it to
// another key; then the row is written (storage/row_insert.hpp).
void insert_row(const RowInsert &insert, const KeyColumns &columns,
                const KeyRef &key) {
  const AttrNumber fixed[] = {columns.scope, columns.key, columns.key_digest};
  check_key_row_kept(fire_before_row_triggers(insert, fixed, lengthof(fixed)),
                     "idempotency.keys", "scope, key or key_digest", key.key);
  write_row(insert);
}

TimestampTz timestamp_in(TupleTableSlot *slot, AttrNumber attnum) {
  bool isnull = false;
  return DatumGetTimestampTz(slot_getattr(slot, attnum, &isnull));
}

} // namespace

StoredRow LocalKeys::store(const KeyTable &table, const KeyRef &key,
                           const NewRow &row) const {
  // fn may have dropped the extension (the drop rolls back with the error).
  Relation rel = try_table_open(table.relid, RowExclusiveLock);
  if (rel == nullptr)
    report_missing_table();
  KeyColumns columns = key_columns(rel);
  role_marks::ensure(rel, columns.scope, key.scope);
  if (row.replaces != nullptr)
    delete_expired_row(table, rel, columns, key, row.replaces->row,
                       row.judged_at);

  // The TTL counts from the write, not from the transaction's start: fn
  // may have run for a long time.
  RowValues values{&key,
                   row.request_hash,
                   row.response,
                   row.response_is_null,
                   0,
                   0,
                   DT_NOBEGIN,
                   0};
  values.created_at = GetCurrentTimestamp();
  values.expires_at = settings::key_expiry(values.created_at, row.ttl);
  // The window after the TTL is fixed now too, as exact time, so that
  // callers and expiry end it at the same instant.
  values.remember_usecs =
      settings::remember_usecs(values.expires_at, row.remember);

  // keys_loaded (protocol/loaded_rows.hpp) computes what fill_row() has
  // set: a call does not pay for it.
  RowInsert insert = begin_row_insert(rel, cache.loader_function);
  fill_row(insert, columns, values);
  insert_row(insert, columns, key);
  StoredRow stored{timestamp_in(insert.slot, columns.created_at),
                   timestamp_in(insert.slot, columns.expires_at)};
  end_row_insert(insert);
  table_close(rel, NoLock);

  commit_guard::note_key_written(stored.expires_at);
  citus::note_key_write();
  return stored;
}

TombstoneWriter begin_tombstones(Relation rel) {
  TombstoneWriter writer{};
  (void)key_columns(rel);
  writer.insert = begin_row_insert(rel, cache.loader_function);
  writer.empty_key = cstring_to_text("");
  writer.row_context = AllocSetContextCreate(
      CurrentMemoryContext, "idempotency tombstone", ALLOCSET_SMALL_SIZES);
  return writer;
}

void write_tombstone(TombstoneWriter &writer, Relation rel,
                     const Tombstone &tombstone) {
  const KeyColumns &columns = key_columns(rel);
  MemoryContext caller = MemoryContextSwitchTo(writer.row_context);
  KeyRef key{tombstone.scope, writer.empty_key, tombstone.digest,
             false,           InvalidOid,       (Datum)0};
  RowValues values{&key,
                   tombstone.request_hash,
                   (Datum)0,
                   true,
                   tombstone.created_at,
                   tombstone.forgotten_at,
                   tombstone.response_expired_at,
                   tombstone.forgotten_at - tombstone.response_expired_at};
  fill_row(writer.insert, columns, values);
  insert_row(writer.insert, columns, key);
  MemoryContextSwitchTo(caller);
  MemoryContextReset(writer.row_context);
}

void end_tombstones(TombstoneWriter &writer) {
  end_row_insert(writer.insert);
  MemoryContextDelete(writer.row_context);
  pfree(writer.empty_key);
}

bool LocalKeys::remove(const KeyTable &table, const KeyRef &key,
                       const KeyProbe &stored) const {
  Relation rel = table_open(table.relid, RowExclusiveLock);
  KeyColumns columns = key_columns(rel); // refuses a table Citus has taken over
  RowDeleted result = delete_row_version(rel, columns, key, stored.row);
  table_close(rel, NoLock);
  switch (result) {
  case RowDeleted::deleted:
    citus::note_key_write();
    return true;
  case RowDeleted::already_gone:
    return false;
  case RowDeleted::changed:
    break;
  }
  ereport(ERROR, (errcode(ERRCODE_T_R_SERIALIZATION_FAILURE),
                  errmsg("could not serialize access due to concurrent update"),
                  errdetail("The idempotency key was changed while being "
                            "forgotten.")));
  pg_unreachable();
}

Oid LocalKeys::relation() const { return schema::relation("keys"); }

role_keys::Roles LocalKeys::roles_with_keys(Oid relid,
                                            AttrNumber scope_column) const {
  Relation rel = table_open(relid, NoLock); // locked by the caller
  role_keys::Roles roles = role_keys::in_keys(rel, scope_column);
  table_close(rel, NoLock);
  return roles;
}

uint64 LocalKeys::delete_keys_of(Oid relid, AttrNumber scope_column,
                                 Oid role) const {
  Relation rel = table_open(relid, NoLock); // locked by the caller
  uint64 deleted = role_keys::delete_in_keys(rel, scope_column, role);
  table_close(rel, NoLock);
  return deleted;
}

} // namespace idempotency::storage
