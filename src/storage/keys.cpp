#include "idempotency/storage/keys.hpp"

#include "idempotency/storage/citus.hpp"
#include "idempotency/storage/columns.hpp"
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
#include "catalog/pg_extension.h"
#include "catalog/pg_type.h"
#include "executor/executor.h"
#include "mb/pg_wchar.h"
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
  Oid loader_function;   // idempotency.keys_loaded(), InvalidOid before 0.6
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
  Oid schema = get_namespace_oid("idempotency", false);
  Oid table = get_relname_relid("keys", schema);
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

// The version of the extension in this database, as pg_extension records
// it; nullptr when there is none.
char *installed_version() {
  Relation extensions = table_open(ExtensionRelationId, AccessShareLock);
  ScanKeyData name;
  ScanKeyInit(&name, Anum_pg_extension_extname, BTEqualStrategyNumber, F_NAMEEQ,
              CStringGetDatum("idempotency"));
  SysScanDesc scan = systable_beginscan(extensions, ExtensionNameIndexId, true,
                                        nullptr, 1, &name);
  char *version = nullptr;
  HeapTuple tuple = systable_getnext(scan);
  if (HeapTupleIsValid(tuple)) {
    bool isnull;
    Datum value = heap_getattr(tuple, Anum_pg_extension_extversion,
                               RelationGetDescr(extensions), &isnull);
    if (!isnull)
      version = text_to_cstring(DatumGetTextPP(value));
  }
  systable_endscan(scan);
  table_close(extensions, AccessShareLock);
  return version;
}

// Whether key_digest still holds digests over the database encoding: 0.4
// and 0.5 stored them so, and the update to 0.6 recomputes them (then
// alters the table, which makes every backend locate the columns again).
bool digests_in_database_encoding() {
  int encoding = GetDatabaseEncoding();
  if (encoding == PG_UTF8 || encoding == PG_SQL_ASCII)
    return false;
  char *version = installed_version();
  return version != nullptr &&
         (strcmp(version, "0.4") == 0 || strcmp(version, "0.5") == 0);
}

// Whether key_digest still holds every key's unordered digest, as 0.4 to
// 0.6 stored it; the update to 0.7 recomputes them (and alters the table,
// which makes every backend locate the columns again).
bool digests_unordered() {
  char *version = installed_version();
  return version != nullptr &&
         (strcmp(version, "0.4") == 0 || strcmp(version, "0.5") == 0 ||
          strcmp(version, "0.6") == 0);
}

// Refuses a table whose columns the extension could not read or write
// correctly: a value stored under another type would be misread later.
//
// A table without key_digest has the row of versions before 0.4 (primary
// key on the key's text, request_hash as hex text): the library serves it
// until ALTER EXTENSION UPDATE changes it.
KeyColumns locate_columns(Relation rel) {
  TupleDesc desc = RelationGetDescr(rel);
  KeyColumns columns{};
  columns.text_layout = find_column(desc, "key_digest") == nullptr;
  for (ExpectedColumn expected : expected_columns) {
    if (columns.text_layout && expected.field == &KeyColumns::key_digest)
      continue;
    if (columns.text_layout && expected.field == &KeyColumns::request_hash)
      expected.type = TEXTOID;
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
  columns.legacy_digest =
      !columns.text_layout && digests_in_database_encoding();
  columns.unordered_digest = !columns.text_layout && digests_unordered();
  return columns;
}

bool is_ours(const KeyColumns &columns, AttrNumber attnum) {
  for (const ExpectedColumn &expected : expected_columns)
    if (columns.*expected.field == attnum && attnum != InvalidAttrNumber)
      return true;
  return false;
}

bool is_ours_column(const void *columns, AttrNumber attnum) {
  return is_ours(*static_cast<const KeyColumns *>(columns), attnum);
}

// The function of the trigger keys_loaded (protocol/loaded_rows.hpp), which
// fixes rows that COPY or INSERT load; InvalidOid before version 0.6.
Oid loader_function() {
  List *name = list_make2(makeString(pstrdup("idempotency")),
                          makeString(pstrdup("keys_loaded")));
  return LookupFuncName(name, 0, nullptr, true);
}

// Replaces the cached columns. The old memory context may still be in use
// by a store further up the stack (a trigger or default that calls
// idempotent_call): it lives until the transaction ends. The catalog
// lookups below may take in invalidations; if one concerns the table, what
// was built serves this call and the next one looks again.
void remember_columns(Relation rel) {
  uint64 invalidations = cache.invalidations;
  KeyColumns columns = locate_columns(rel);
  if (cache.context != nullptr)
    MemoryContextSetParent(cache.context, TopTransactionContext);
  cache.context = AllocSetContextCreate(
      CacheMemoryContext, "idempotency keys table", ALLOCSET_SMALL_SIZES);
  MemoryContext previous = MemoryContextSwitchTo(cache.context);
  cache.default_count =
      plan_defaults(rel, is_ours_column, &columns, &cache.defaults);
  MemoryContextSwitchTo(previous);
  cache.loader_function = loader_function();
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
    Oid schema = get_namespace_oid("idempotency", true);
    Oid relid =
        OidIsValid(schema) ? get_relname_relid("keys", schema) : InvalidOid;
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

bool is_expired(Relation rel, const KeyColumns &columns, HeapTuple tuple,
                TimestampTz now) {
  bool isnull = false;
  return DatumGetTimestampTz(heap_getattr(
             tuple, columns.expires_at, RelationGetDescr(rel), &isnull)) <= now;
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
  result.request_hash_is_hex = columns.text_layout;
  result.response =
      copy_varlena(tuple, columns.response, desc, &result.response_is_null);
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

namespace {

// The digest that the table's rows hold for `key`.
Datum stored_digest(const KeyColumns &columns, const KeyRef &key) {
  if (columns.legacy_digest && key.legacy_digest != nullptr)
    return PointerGetDatum(key.legacy_digest);
  if (columns.unordered_digest && key.unordered_digest != nullptr)
    return PointerGetDatum(key.unordered_digest);
  return PointerGetDatum(key.digest);
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
  if (columns.text_layout) {
    ScanKeyInit(&scan_keys[1], columns.key, BTEqualStrategyNumber, F_TEXTEQ,
                PointerGetDatum(key.key));
    scan_keys[1].sk_collation = C_COLLATION_OID;
  } else {
    ScanKeyInit(&scan_keys[1], columns.key_digest, BTEqualStrategyNumber,
                F_BYTEAEQ, stored_digest(columns, key));
  }

  SnapshotData dirty;
  InitDirtySnapshot(dirty);
  SysScanDesc scan =
      systable_beginscan(rel, compat::RelationGetPrimaryKeyIndex(rel, false),
                         true, &dirty, 2, scan_keys);

  KeyProbe result{};
  result.state = KeyState::absent;
  HeapTuple tuple;
  while ((tuple = systable_getnext(scan)) != nullptr) {
    if (!same_key(rel, columns, tuple, key.key))
      report_shared_digest();
    // The dirty snapshot reports an open inserter in xmin and an open
    // deleter in xmax. A row being inserted means another transaction holds
    // the key right now.
    if (TransactionIdIsValid(dirty.xmin)) {
      result = in_progress(dirty.xmin);
      break;
    }
    bool expired = is_expired(rel, columns, tuple, now);
    // An expired row being deleted - by the expiry worker, or by a caller
    // replacing it (who holds the key's claim and shows its new row) - is
    // as absent as any expired row; store() waits for that delete to end.
    // A live row being deleted is another transaction's business: wait.
    if (TransactionIdIsValid(dirty.xmax) && !expired) {
      result = in_progress(dirty.xmax);
      break;
    }
    if (expired) {
      result = expired_row(rel, columns, tuple);
      continue; // the key's new row, if any, may come next
    }
    result = done_row(rel, columns, scan, tuple);
    break;
  }

  systable_endscan(scan);
  table_close(rel, NoLock);
  return result;
}

// --- writing ----------------------------------------------------------------

namespace {

// Whether `tuple` is a row of `key`: its scope and digest (the probe that
// found the row compared the key's text), or the key's text in the layout
// without digests. Reads only values kept in the row, never out of line:
// the caller holds the page's lock.
bool is_key_row(Relation rel, const KeyColumns &columns, HeapTuple tuple,
                const KeyRef &key) {
  TupleDesc desc = RelationGetDescr(rel);
  bool isnull = false;
  Datum scope = heap_getattr(tuple, columns.scope, desc, &isnull);
  if (isnull || DatumGetObjectId(scope) != key.scope)
    return false;
  AttrNumber identity = columns.text_layout ? columns.key : columns.key_digest;
  Datum expected = columns.text_layout ? PointerGetDatum(key.key)
                                       : stored_digest(columns, key);
  Datum stored = heap_getattr(tuple, identity, desc, &isnull);
  if (isnull || VARATT_IS_EXTERNAL(DatumGetPointer(stored)) ||
      VARATT_IS_COMPRESSED(DatumGetPointer(stored)))
    return false; // never so for a key's text or digest
  return datum_image_eq(stored, expected, false, -1);
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

// Removes the expired row the new one replaces. The expiry worker may have
// deleted it meanwhile (then there is nothing to do); no one else changes a
// row whose key this transaction has claimed.
void delete_expired_row(Relation rel, const KeyColumns &columns,
                        const KeyRef &key, const RowVersion &version) {
  if (delete_row_version(rel, columns, key, version) != RowDeleted::changed)
    return;
  ereport(ERROR, (errcode(ERRCODE_T_R_SERIALIZATION_FAILURE),
                  errmsg("could not serialize access due to concurrent update"),
                  errdetail("An expired idempotency key was changed while "
                            "being replaced.")));
}

struct RowValues {
  const KeyRef *key;
  bytea *request_hash;
  Datum response;
  bool response_is_null;
  TimestampTz created_at;
  TimestampTz expires_at;
};

// A fingerprint as versions before 0.4 stored it: lower-case hex text.
text *as_hex(const bytea *fingerprint) {
  static constexpr char digits[] = "0123456789abcdef";
  Size size = VARSIZE_ANY_EXHDR(fingerprint);
  const uint8 *bytes =
      reinterpret_cast<const uint8 *>(VARDATA_ANY(fingerprint));
  text *hex = static_cast<text *>(palloc(VARHDRSZ + 2 * size));
  SET_VARSIZE(hex, VARHDRSZ + 2 * size);
  char *out = VARDATA(hex);
  for (Size i = 0; i < size; i++) {
    out[2 * i] = digits[bytes[i] >> 4];
    out[2 * i + 1] = digits[bytes[i] & 0x0f];
  }
  return hex;
}

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
  if (columns.text_layout) {
    set(columns.request_hash, PointerGetDatum(as_hex(row.request_hash)), false);
  } else {
    set(columns.key_digest, stored_digest(columns, *row.key), false);
    set(columns.request_hash, PointerGetDatum(row.request_hash), false);
  }
  set(columns.response, row.response, row.response_is_null);
  set(columns.created_at, TimestampTzGetDatum(row.created_at), false);
  set(columns.expires_at, TimestampTzGetDatum(row.expires_at), false);

  evaluate_defaults(insert, cache.defaults, cache.default_count);
  ExecStoreVirtualTuple(slot);
}

// BEFORE row triggers may change the row, but not drop it or move it to
// another key; then the row is written (storage/row_insert.hpp).
void insert_row(const RowInsert &insert, const KeyColumns &columns,
                const KeyRef &key) {
  const AttrNumber fixed[] = {columns.scope, columns.key, columns.key_digest};
  int fixed_count = columns.text_layout ? 2 : 3; // no key_digest before 0.4
  check_key_row_kept(fire_before_row_triggers(insert, fixed, fixed_count),
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
    delete_expired_row(rel, columns, key, row.replaces->row);

  // The TTL counts from the write, not from the transaction's start: fn
  // may have run for a long time.
  RowValues values{
      &key, row.request_hash, row.response, row.response_is_null, 0, 0};
  values.created_at = GetCurrentTimestamp();
  values.expires_at = settings::key_expiry(values.created_at, row.ttl);

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

} // namespace idempotency::storage
