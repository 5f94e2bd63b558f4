#include "storage/keys.hpp"

namespace idempotency::storage {

namespace {

pg_attribute_noreturn() void report_missing_table() {
  ereport(ERROR, (errcode(ERRCODE_UNDEFINED_TABLE),
                  errmsg("table idempotency.keys does not exist"),
                  errhint("Run CREATE EXTENSION idempotency.")));
  pg_unreachable();
}

Oid keys_table_oid() {
  Oid schema = get_namespace_oid("idempotency", false);
  Oid table = get_relname_relid("keys", schema);
  if (!OidIsValid(table))
    report_missing_table();
  return table;
}

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

bool is_expired(Relation rel, HeapTuple tuple, TimestampTz now) {
  bool isnull = false;
  return DatumGetTimestampTz(heap_getattr(
             tuple, column::expires_at, RelationGetDescr(rel), &isnull)) <= now;
}

void read_times(Relation rel, HeapTuple tuple, KeyProbe &result) {
  TupleDesc desc = RelationGetDescr(rel);
  bool isnull = false;
  result.created_at = DatumGetTimestampTz(
      heap_getattr(tuple, column::created_at, desc, &isnull));
  result.expires_at = DatumGetTimestampTz(
      heap_getattr(tuple, column::expires_at, desc, &isnull));
}

KeyProbe expired_row(Relation rel, HeapTuple tuple) {
  KeyProbe result{};
  result.state = KeyState::expired;
  result.row = tuple->t_self;
  read_times(rel, tuple, result);
  return result;
}

KeyProbe done_row(Relation rel, SysScanDesc scan, HeapTuple tuple) {
  check_visible_to_snapshot(rel, scan, tuple);
  KeyProbe result{};
  TupleDesc desc = RelationGetDescr(rel);
  bool isnull = false;
  result.state = KeyState::done;
  result.row = tuple->t_self;
  read_times(rel, tuple, result);
  result.request_hash = reinterpret_cast<text *>(DatumGetPointer(
      copy_varlena(tuple, column::request_hash, desc, &isnull)));
  result.response =
      copy_varlena(tuple, column::response, desc, &result.response_is_null);
  return result;
}

KeyProbe in_progress(TransactionId holder) {
  KeyProbe result{};
  result.state = KeyState::in_progress;
  result.holder = holder;
  return result;
}

} // namespace

KeyTable key_table() { return KeyTable{keys_table_oid()}; }

KeyProbe probe(const KeyTable &table, const KeyRef &key, TimestampTz now) {
  Relation rel = table_open(table.relid, AccessShareLock);

  ScanKeyData scan_keys[2];
  ScanKeyInit(&scan_keys[0], column::scope, BTEqualStrategyNumber, F_OIDEQ,
              ObjectIdGetDatum(key.scope));
  ScanKeyInit(&scan_keys[1], column::key, BTEqualStrategyNumber, F_TEXTEQ,
              PointerGetDatum(key.key));
  scan_keys[1].sk_collation = C_COLLATION_OID;

  SnapshotData dirty;
  InitDirtySnapshot(dirty);
  SysScanDesc scan = systable_beginscan(rel, RelationGetPrimaryKeyIndex(rel),
                                        true, &dirty, 2, scan_keys);

  KeyProbe result{};
  result.state = KeyState::absent;
  HeapTuple tuple;
  while ((tuple = systable_getnext(scan)) != nullptr) {
    // The dirty snapshot reports an open inserter in xmin and an open
    // deleter in xmax. A row being inserted means another transaction holds
    // the key right now.
    if (TransactionIdIsValid(dirty.xmin)) {
      result = in_progress(dirty.xmin);
      break;
    }
    bool expired = is_expired(rel, tuple, now);
    // An expired row being deleted - by the expiry worker, or by a caller
    // replacing it (who holds the key's claim and shows its new row) - is
    // as absent as any expired row; store() waits for that delete to end.
    // A live row being deleted is another transaction's business: wait.
    if (TransactionIdIsValid(dirty.xmax) && !expired) {
      result = in_progress(dirty.xmax);
      break;
    }
    if (expired) {
      result = expired_row(rel, tuple);
      continue; // the key's new row, if any, may come next
    }
    result = done_row(rel, scan, tuple);
    break;
  }

  systable_endscan(scan);
  table_close(rel, NoLock);
  return result;
}

namespace {

HeapTuple form_row(Relation rel, const KeyRef &key, text *request_hash,
                   Datum response, bool response_is_null,
                   TimestampTz created_at, TimestampTz expires_at) {
  // A row is written only once its call is done (see the install script).
  Datum values[column::count] = {ObjectIdGetDatum(key.scope),
                                 PointerGetDatum(key.key),
                                 PointerGetDatum(request_hash),
                                 CStringGetTextDatum("done"),
                                 response,
                                 TimestampTzGetDatum(created_at),
                                 TimestampTzGetDatum(expires_at)};
  bool nulls[column::count] = {false, false, false, false, response_is_null,
                               false, false};
  return heap_form_tuple(RelationGetDescr(rel), values, nulls);
}

// Removes the expired row the new one replaces. The expiry worker may have
// deleted it meanwhile (then there is nothing to do); no one else changes a
// row whose key this transaction has claimed.
void delete_expired_row(Relation rel, ItemPointer row) {
  TM_FailureData failure;
  TM_Result result = table_tuple_delete(
      rel, row, GetCurrentCommandId(true), GetActiveSnapshot(), InvalidSnapshot,
      true /* wait */, &failure, false /* changingPart */);
  if (result == TM_Ok || result == TM_Deleted)
    return;
  ereport(ERROR, (errcode(ERRCODE_T_R_SERIALIZATION_FAILURE),
                  errmsg("could not serialize access due to concurrent update"),
                  errdetail("An expired idempotency key was changed while "
                            "being replaced.")));
}

// Adds the row's entries to every index of the table, checking uniqueness
// as the executor does (waiting for an open transaction that inserted the
// same key, raising 23505 if it commits).
void insert_index_entries(Relation rel, HeapTuple row) {
  TupleTableSlot *slot =
      MakeSingleTupleTableSlot(RelationGetDescr(rel), &TTSOpsHeapTuple);
  ExecStoreHeapTuple(row, slot, false);
  List *indexes = RelationGetIndexList(rel);
  ListCell *cell;
  foreach (cell, indexes) {
    Relation index = index_open(lfirst_oid(cell), RowExclusiveLock);
    IndexInfo *info = BuildIndexInfo(index);
    if (info->ii_Expressions != NIL || info->ii_Predicate != NIL)
      ereport(ERROR,
              (errcode(ERRCODE_FEATURE_NOT_SUPPORTED),
               errmsg("index \"%s\" on idempotency.keys is not supported",
                      RelationGetRelationName(index)),
               errdetail("Indexes on idempotency.keys may not have "
                         "expressions or predicates.")));
    Datum values[INDEX_MAX_KEYS];
    bool nulls[INDEX_MAX_KEYS];
    FormIndexDatum(info, slot, nullptr, values, nulls);
    index_insert(index, values, nulls, &row->t_self, rel,
                 info->ii_Unique ? UNIQUE_CHECK_YES : UNIQUE_CHECK_NO, false,
                 info);
    index_close(index, NoLock);
  }
  list_free(indexes);
  ExecDropSingleTupleTableSlot(slot);
}

} // namespace

void store(const KeyTable &table, const KeyRef &key, text *request_hash,
           Datum response, bool response_is_null, TimestampTz created_at,
           TimestampTz expires_at, const ItemPointerData *expired_row) {
  // fn may have dropped the extension (the drop rolls back with the error).
  Relation rel = try_table_open(table.relid, RowExclusiveLock);
  if (rel == nullptr)
    report_missing_table();
  if (expired_row != nullptr)
    delete_expired_row(rel, const_cast<ItemPointer>(expired_row));
  HeapTuple row = form_row(rel, key, request_hash, response, response_is_null,
                           created_at, expires_at);
  simple_heap_insert(rel, row);
  insert_index_entries(rel, row);
  heap_freetuple(row);
  table_close(rel, NoLock);
}

bool remove(const KeyTable &table, const ItemPointerData &row) {
  Relation rel = table_open(table.relid, RowExclusiveLock);
  TM_FailureData failure;
  TM_Result result = table_tuple_delete(
      rel, const_cast<ItemPointer>(&row), GetCurrentCommandId(true),
      GetActiveSnapshot(), InvalidSnapshot, true /* wait */, &failure,
      false /* changingPart */);
  table_close(rel, NoLock);
  if (result == TM_Ok)
    return true;
  if (result == TM_Deleted)
    return false;
  ereport(ERROR, (errcode(ERRCODE_T_R_SERIALIZATION_FAILURE),
                  errmsg("could not serialize access due to concurrent update"),
                  errdetail("The idempotency key was changed while being "
                            "forgotten.")));
  pg_unreachable();
}

} // namespace idempotency::storage
