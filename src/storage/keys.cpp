#include "storage/keys.hpp"

namespace idempotency::storage {

namespace {

// Column numbers of idempotency.keys, as created by the install script.
constexpr AttrNumber att_scope = 1;
constexpr AttrNumber att_key = 2;
constexpr AttrNumber att_request_hash = 3;
constexpr AttrNumber att_response = 5;
constexpr AttrNumber att_expires_at = 7;

Oid keys_table_oid() {
  Oid schema = get_namespace_oid("idempotency", false);
  Oid table = get_relname_relid("keys", schema);
  if (!OidIsValid(table))
    ereport(ERROR, (errcode(ERRCODE_UNDEFINED_TABLE),
                    errmsg("table idempotency.keys does not exist"),
                    errhint("Run CREATE EXTENSION idempotency.")));
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

KeyProbe read_row(Relation rel, SysScanDesc scan, HeapTuple tuple,
                  TimestampTz now) {
  KeyProbe result{};
  TupleDesc desc = RelationGetDescr(rel);
  bool isnull = false;
  TimestampTz expires_at =
      DatumGetTimestampTz(heap_getattr(tuple, att_expires_at, desc, &isnull));
  if (expires_at <= now) {
    result.state = KeyState::expired;
    return result;
  }
  check_visible_to_snapshot(rel, scan, tuple);
  result.state = KeyState::done;
  result.request_hash = reinterpret_cast<text *>(
      DatumGetPointer(copy_varlena(tuple, att_request_hash, desc, &isnull)));
  result.response =
      copy_varlena(tuple, att_response, desc, &result.response_is_null);
  return result;
}

} // namespace

KeyTable key_table() {
  KeyTable table;
  table.relid = keys_table_oid();
  HeapTuple tuple = SearchSysCache1(RELOID, ObjectIdGetDatum(table.relid));
  if (!HeapTupleIsValid(tuple))
    elog(ERROR, "cache lookup failed for table idempotency.keys");
  table.owner = reinterpret_cast<Form_pg_class>(GETSTRUCT(tuple))->relowner;
  ReleaseSysCache(tuple);
  return table;
}

KeyProbe probe(const KeyTable &table, const KeyRef &key, TimestampTz now) {
  Relation rel = table_open(table.relid, AccessShareLock);

  ScanKeyData scan_keys[2];
  ScanKeyInit(&scan_keys[0], att_scope, BTEqualStrategyNumber, F_OIDEQ,
              ObjectIdGetDatum(key.scope));
  ScanKeyInit(&scan_keys[1], att_key, BTEqualStrategyNumber, F_TEXTEQ,
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
    // deleter or updater in xmax. Either way another transaction holds the
    // key right now.
    if (TransactionIdIsValid(dirty.xmin) || TransactionIdIsValid(dirty.xmax)) {
      result.state = KeyState::in_progress;
      result.holder =
          TransactionIdIsValid(dirty.xmin) ? dirty.xmin : dirty.xmax;
      break;
    }
    result = read_row(rel, scan, tuple, now);
    if (result.state == KeyState::done)
      break;
  }

  systable_endscan(scan);
  table_close(rel, NoLock);
  return result;
}

namespace {

SPIPlanPtr insert_plan = nullptr;
SPIPlanPtr replace_plan = nullptr;

constexpr int store_nargs = 6;
const Oid store_argtypes[store_nargs] = {
    REGROLEOID, TEXTOID, TEXTOID, JSONBOID, TIMESTAMPTZOID, TIMESTAMPTZOID};

// Plans are prepared once per backend and kept; the plan cache replans them
// if the table is recreated. Every name and operator is qualified.
SPIPlanPtr prepare_kept(const char *sql) {
  SPIPlanPtr plan =
      SPI_prepare(sql, store_nargs, const_cast<Oid *>(store_argtypes));
  if (plan == nullptr)
    elog(ERROR, "SPI_prepare failed for idempotency storage: %s",
         SPI_result_code_string(SPI_result));
  if (SPI_keepplan(plan) != 0)
    elog(ERROR, "SPI_keepplan failed for idempotency storage");
  return plan;
}

SPIPlanPtr plan_for(bool replace_expired) {
  if (replace_expired) {
    if (replace_plan == nullptr)
      replace_plan = prepare_kept(
          "UPDATE idempotency.keys SET request_hash = $3, status = 'done', "
          "response = $4, created_at = $5, expires_at = $6 "
          "WHERE scope OPERATOR(pg_catalog.=) $1 "
          "AND key OPERATOR(pg_catalog.=) $2 "
          "AND expires_at OPERATOR(pg_catalog.<=) $5");
    return replace_plan;
  }
  if (insert_plan == nullptr)
    insert_plan = prepare_kept(
        "INSERT INTO idempotency.keys "
        "(scope, key, request_hash, status, response, created_at, expires_at) "
        "VALUES ($1, $2, $3, 'done', $4, $5, $6)");
  return insert_plan;
}

uint64 execute_as_owner(SPIPlanPtr plan, Oid owner, Datum *values,
                        const char *nulls) {
  Oid saved_user;
  int saved_security_context;
  GetUserIdAndSecContext(&saved_user, &saved_security_context);
  SetUserIdAndSecContext(owner, saved_security_context |
                                    SECURITY_LOCAL_USERID_CHANGE |
                                    SECURITY_NOFORCE_RLS);
  // An error here aborts the (sub)transaction, which restores the user.
  int rc = SPI_execute_plan(plan, values, nulls, false, 0);
  SetUserIdAndSecContext(saved_user, saved_security_context);
  if (rc != SPI_OK_INSERT && rc != SPI_OK_UPDATE)
    elog(ERROR, "storing idempotency key failed: %s",
         SPI_result_code_string(rc));
  return SPI_processed;
}

} // namespace

void store(const KeyTable &table, const KeyRef &key, text *request_hash,
           Datum response, bool response_is_null, TimestampTz created_at,
           TimestampTz expires_at, bool replace_expired) {
  Datum values[store_nargs] = {
      ObjectIdGetDatum(key.scope),     PointerGetDatum(key.key),
      PointerGetDatum(request_hash),   response,
      TimestampTzGetDatum(created_at), TimestampTzGetDatum(expires_at)};
  char nulls[store_nargs] = {' ', ' ', ' ', response_is_null ? 'n' : ' ',
                             ' ', ' '};

  // The expired row may have been deleted meanwhile by the expiry worker:
  // then there is nothing to replace and the key is inserted.
  if (replace_expired &&
      execute_as_owner(plan_for(true), table.owner, values, nulls) == 1)
    return;
  execute_as_owner(plan_for(false), table.owner, values, nulls);
}

} // namespace idempotency::storage
