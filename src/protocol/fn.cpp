#include "idempotency/fingerprint/fingerprint.hpp"
#include "idempotency/protocol/rules.hpp"

#include "idempotency/protocol/fn.hpp"
#include "idempotency/protocol/statement_cache.hpp"

extern "C" {
#include "funcapi.h"
#include "nodes/makefuncs.h"
#include "utils/fmgroids.h"
#include "utils/jsonb.h"
}

namespace idempotency::protocol {

namespace {

// to_jsonb() learns its argument's type from the call expression, so it is
// called through an FmgrInfo whose fn_expr carries a typed placeholder.
Datum to_jsonb_of(Datum value, Oid type) {
  FmgrInfo flinfo;
  fmgr_info(F_TO_JSONB, &flinfo);
  List *call_args = list_make1(makeNullConst(type, -1, InvalidOid));
  flinfo.fn_expr = reinterpret_cast<Node *>(
      makeFuncExpr(F_TO_JSONB, JSONBOID, call_args, InvalidOid, InvalidOid,
                   COERCE_EXPLICIT_CALL));
  return FunctionCall1(&flinfo, value);
}

Datum jsonb_null() {
  JsonbValue null_value;
  null_value.type = jbvNull;
  return JsonbPGetDatum(JsonbValueToJsonb(&null_value));
}

// One row as jsonb: its single value, or an object of its columns.
Datum row_to_jsonb(HeapTuple row, TupleDesc desc) {
  if (row_is_object(desc->natts))
    return to_jsonb_of(heap_copy_tuple_as_datum(row, desc), RECORDOID);
  bool is_null;
  Datum value = SPI_getbinval(row, desc, 1, &is_null);
  if (is_null)
    return jsonb_null();
  return to_jsonb_of(value, SPI_gettypeid(desc, 1));
}

Datum rows_to_jsonb(SPITupleTable *table, uint64 rows) {
  auto *elements = static_cast<Datum *>(palloc(sizeof(Datum) * rows));
  for (uint64 i = 0; i < rows; i++)
    elements[i] = row_to_jsonb(table->vals[i], table->tupdesc);
  ArrayType *array =
      construct_array(elements, (int)rows, JSONBOID, -1, false, TYPALIGN_INT);
  return to_jsonb_of(PointerGetDatum(array), JSONBARRAYOID);
}

Datum result_to_jsonb(SPITupleTable *table, uint64 rows, bool *is_null) {
  *is_null = false;
  int columns = table == nullptr ? 0 : table->tupdesc->natts;
  ResultShape shape = result_shape(rows, columns);
  if (table == nullptr || shape == ResultShape::no_response) {
    *is_null = true;
    return (Datum)0;
  }
  // Rows become records, which to_jsonb finds through a blessed descriptor.
  if (row_is_object(columns))
    BlessTupleDesc(table->tupdesc);
  if (shape != ResultShape::array)
    return row_to_jsonb(table->vals[0], table->tupdesc);
  if (rows > (uint64)MaxArraySize)
    ereport(ERROR, (errcode(ERRCODE_PROGRAM_LIMIT_EXCEEDED),
                    errmsg("fn returned too many rows for one response")));
  return rows_to_jsonb(table, rows);
}

// SPI refuses some statements by return code rather than by error.
void check_execution(int rc) {
  if (rc == SPI_ERROR_TRANSACTION)
    ereport(ERROR,
            (errcode(ERRCODE_INVALID_TRANSACTION_TERMINATION),
             errmsg("fn cannot commit, roll back or otherwise control the "
                    "transaction"),
             errdetail("fn runs inside the caller's transaction, which "
                       "commits or rolls back the key with it.")));
  if (rc == SPI_ERROR_COPY)
    ereport(ERROR, (errcode(ERRCODE_FEATURE_NOT_SUPPORTED),
                    errmsg("fn cannot run COPY to or from the client")));
  if (rc < 0)
    elog(ERROR, "running fn failed: %s", SPI_result_code_string(rc));
}

} // namespace

Datum run_fn(Statement &statement, const FnArgs &args, bool *is_null) {
  MemoryContext result_context = CurrentMemoryContext;
  if (SPI_connect() != SPI_OK_CONNECT)
    elog(ERROR, "SPI_connect failed");
  SPIPlanPtr plan = plan_of(statement);
  auto *nulls = static_cast<char *>(palloc(Max(args.count, 1)));
  for (int i = 0; i < args.count; i++)
    nulls[i] = args.nulls[i] ? 'n' : ' ';
  check_execution(SPI_execute_plan(plan, args.values, nulls, false, 0));

  // The response outlives the SPI connection.
  MemoryContext spi_context = MemoryContextSwitchTo(result_context);
  Datum response = result_to_jsonb(SPI_tuptable, SPI_processed, is_null);
  MemoryContextSwitchTo(spi_context);
  SPI_finish();
  return response;
}

} // namespace idempotency::protocol
