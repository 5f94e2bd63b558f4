// Bodies of the application API's SQL functions (protocol/app_api) and of
// idempotency.last_call(), declared in entry/functions.cpp. Table functions
// return their one row (or none) through a materialized result set.
#include "idempotency/entry/functions.hpp"

#include "idempotency/entry/arguments.hpp"
#include "idempotency/protocol/app_api.hpp"
#include "idempotency/protocol/call.hpp"

extern "C" {
#include "funcapi.h"
#include "utils/array.h"
#include "utils/lsyscache.h"
#include "utils/builtins.h"
#include "utils/timestamp.h"
#include "utils/tuplestore.h"
}

namespace idempotency::entry {

namespace {

// After the key (and, for the tenant_* functions, the tenant before it).
constexpr int arg_request_hash = 1;
constexpr int arg_response = 1;

constexpr int max_columns = 4;

struct Row {
  Datum values[max_columns];
  bool nulls[max_columns];
};

void set(Row &row, int column, Datum value, bool is_null = false) {
  row.values[column] = value;
  row.nulls[column] = is_null;
}

void set_time(Row &row, int column, bool has_time, TimestampTz time) {
  set(row, column, TimestampTzGetDatum(time), !has_time);
}

// Materializes the result with the row type the caller expects when it
// gives one: building it from the function's catalog entry costs more than
// the rest of a claim's result.
void init_result(FunctionCallInfo fcinfo) {
  auto *result = reinterpret_cast<ReturnSetInfo *>(fcinfo->resultinfo);
  bool expected = result != nullptr && IsA(result, ReturnSetInfo) &&
                  result->expectedDesc != nullptr;
  InitMaterializedSRF(fcinfo, expected ? MAT_SRF_USE_EXPECTED_DESC : 0);
}

Datum return_rows(FunctionCallInfo fcinfo, Row *row) {
  init_result(fcinfo);
  auto *result = reinterpret_cast<ReturnSetInfo *>(fcinfo->resultinfo);
  if (row != nullptr)
    tuplestore_putvalues(result->setResult, result->setDesc, row->values,
                         row->nulls);
  return (Datum)0;
}

// The argument after the key, or nullptr when it is NULL.
text *text_after_key(FunctionCallInfo fcinfo, Keying keying, int argno) {
  int position = key_argno(keying) + argno;
  return PG_ARGISNULL(position) ? nullptr : PG_GETARG_TEXT_PP(position);
}

Datum claim_rows(FunctionCallInfo fcinfo, Keying keying) {
  // A claim that fails on its arguments leaves no last call behind.
  protocol::clear_last_call();
  storage::KeyRef key = request_key(fcinfo, keying);
  protocol::ClaimRow claimed = protocol::claim_key(
      key, text_after_key(fcinfo, keying, arg_request_hash));
  Row row{};
  set(row, 0, BoolGetDatum(claimed.replayed));
  set(row, 1, claimed.response, claimed.response_is_null);
  set_time(row, 2, claimed.has_times, claimed.created_at);
  set_time(row, 3, claimed.has_times, claimed.expires_at);
  return return_rows(fcinfo, &row);
}

Datum lookup_rows(FunctionCallInfo fcinfo, Keying keying) {
  protocol::LookupRow found = protocol::lookup_key(request_key(fcinfo, keying));
  Row row{};
  set(row, 0, CStringGetTextDatum(protocol::lookup_state_name(found.state)));
  set_time(row, 1, found.has_times, found.created_at);
  set_time(row, 2, found.has_times, found.expires_at);
  set(row, 3, found.response, found.response_is_null);
  return return_rows(fcinfo, &row);
}

void complete(FunctionCallInfo fcinfo, Keying keying) {
  storage::KeyRef key = request_key(fcinfo, keying);
  int response_argno = key_argno(keying) + arg_response;
  bool response_is_null = PG_ARGISNULL(response_argno);
  Datum response =
      response_is_null ? (Datum)0 : PG_GETARG_DATUM(response_argno);
  protocol::complete_key(key, response, response_is_null);
}

// The elements of array argument `argno`, named `name` in errors: 22004
// when the array is NULL, 22023 when it has more than one dimension.
struct Elements {
  Datum *values;
  bool *nulls;
  int count;
};

Elements array_argument(FunctionCallInfo fcinfo, int argno, const char *name) {
  if (PG_ARGISNULL(argno))
    ereport(ERROR, (errcode(ERRCODE_NULL_VALUE_NOT_ALLOWED),
                    errmsg("%s must not be null", name)));
  ArrayType *array = PG_GETARG_ARRAYTYPE_P(argno);
  if (ARR_NDIM(array) > 1)
    ereport(ERROR, (errcode(ERRCODE_INVALID_PARAMETER_VALUE),
                    errmsg("%s must be a one-dimensional array", name)));
  int16 length;
  bool by_value;
  char align;
  get_typlenbyvalalign(ARR_ELEMTYPE(array), &length, &by_value, &align);
  Elements elements{};
  deconstruct_array(array, ARR_ELEMTYPE(array), length, by_value, align,
                    &elements.values, &elements.nulls, &elements.count);
  return elements;
}

void check_same_length(const Elements &keys, const Elements &other,
                       const char *name) {
  if (other.count != keys.count)
    ereport(ERROR,
            (errcode(ERRCODE_INVALID_PARAMETER_VALUE),
             errmsg("%s has %d elements and keys %d", name, other.count,
                    keys.count),
             errdetail("Element i of %s belongs to element i of keys.", name)));
}

// Every key of a batch, checked before any is taken: 22004 for a NULL key,
// 22023 for an empty or too long one.
storage::KeyRef *batch_keys(const Elements &keys) {
  auto *refs = static_cast<storage::KeyRef *>(
      palloc(sizeof(storage::KeyRef) * Max(keys.count, 1)));
  for (int i = 0; i < keys.count; i++)
    refs[i] = role_key(keys.values[i], keys.nulls[i]);
  return refs;
}

const char *batch_outcome_name(protocol::BatchOutcome outcome) {
  switch (outcome) {
  case protocol::BatchOutcome::claimed:
    return "claimed";
  case protocol::BatchOutcome::replayed:
    return "replayed";
  case protocol::BatchOutcome::refused:
    return "refused";
  }
  return nullptr;
}

} // namespace

Datum claim_batch_body(FunctionCallInfo fcinfo) {
  Elements keys = array_argument(fcinfo, 0, "keys");
  Elements hashes{};
  if (!PG_ARGISNULL(1)) {
    hashes = array_argument(fcinfo, 1, "request_hashes");
    check_same_length(keys, hashes, "request_hashes");
  }
  storage::KeyRef *refs = batch_keys(keys);
  auto *client_hashes =
      static_cast<text **>(palloc0(sizeof(text *) * Max(keys.count, 1)));
  for (int i = 0; i < hashes.count; i++)
    if (!hashes.nulls[i])
      client_hashes[i] = DatumGetTextPP(hashes.values[i]);
  auto *answers = static_cast<protocol::BatchAnswer *>(
      palloc0(sizeof(protocol::BatchAnswer) * Max(keys.count, 1)));

  protocol::claim_batch(refs, client_hashes, keys.count, answers);

  init_result(fcinfo);
  auto *result = reinterpret_cast<ReturnSetInfo *>(fcinfo->resultinfo);
  constexpr int columns = 8;
  for (int i = 0; i < keys.count; i++) {
    const protocol::BatchAnswer &answer = answers[i];
    bool refused = answer.outcome == protocol::BatchOutcome::refused;
    const protocol::ClaimRow &row = answer.row;
    Datum values[columns] = {
        Int32GetDatum(i + 1),
        keys.values[i],
        CStringGetTextDatum(batch_outcome_name(answer.outcome)),
        refused ? CStringGetTextDatum(unpack_sql_state(answer.sqlerrcode))
                : (Datum)0,
        refused ? CStringGetTextDatum(answer.message) : (Datum)0,
        refused ? (Datum)0 : row.response,
        refused ? (Datum)0 : TimestampTzGetDatum(row.created_at),
        refused ? (Datum)0 : TimestampTzGetDatum(row.expires_at)};
    bool has_times = !refused && row.has_times;
    bool nulls[columns] = {false,      false,
                           false,      !refused,
                           !refused,   refused || row.response_is_null,
                           !has_times, !has_times};
    tuplestore_putvalues(result->setResult, result->setDesc, values, nulls);
  }
  return (Datum)0;
}

Datum complete_batch_body(FunctionCallInfo fcinfo) {
  Elements keys = array_argument(fcinfo, 0, "keys");
  Elements responses = array_argument(fcinfo, 1, "responses");
  check_same_length(keys, responses, "responses");
  storage::KeyRef *refs = batch_keys(keys);
  for (int i = 0; i < keys.count; i++)
    protocol::complete_key(refs[i], responses.values[i], responses.nulls[i]);
  PG_RETURN_VOID();
}

Datum last_call_body(FunctionCallInfo fcinfo) {
  const protocol::LastCall &last = protocol::last_call();
  if (last.outcome == protocol::Outcome::none)
    return return_rows(fcinfo, nullptr);
  Row row{};
  set(row, 0, CStringGetTextDatum(protocol::outcome_name(last.outcome)));
  set_time(row, 1, last.has_times, last.created_at);
  set_time(row, 2, last.has_times, last.expires_at);
  return return_rows(fcinfo, &row);
}

Datum claim_body(FunctionCallInfo fcinfo) {
  return claim_rows(fcinfo, Keying::by_role);
}

Datum complete_body(FunctionCallInfo fcinfo) {
  complete(fcinfo, Keying::by_role);
  PG_RETURN_VOID();
}

Datum release_body(FunctionCallInfo fcinfo) {
  protocol::release_key(request_key(fcinfo, Keying::by_role));
  PG_RETURN_VOID();
}

Datum lookup_body(FunctionCallInfo fcinfo) {
  return lookup_rows(fcinfo, Keying::by_role);
}

Datum forget_body(FunctionCallInfo fcinfo) {
  PG_RETURN_BOOL(protocol::forget_key(request_key(fcinfo, Keying::by_role)));
}

Datum tenant_claim_body(FunctionCallInfo fcinfo) {
  return claim_rows(fcinfo, Keying::by_tenant);
}

Datum tenant_complete_body(FunctionCallInfo fcinfo) {
  complete(fcinfo, Keying::by_tenant);
  PG_RETURN_VOID();
}

Datum tenant_release_body(FunctionCallInfo fcinfo) {
  protocol::release_key(request_key(fcinfo, Keying::by_tenant));
  PG_RETURN_VOID();
}

Datum tenant_lookup_body(FunctionCallInfo fcinfo) {
  return lookup_rows(fcinfo, Keying::by_tenant);
}

Datum tenant_forget_body(FunctionCallInfo fcinfo) {
  PG_RETURN_BOOL(protocol::forget_key(request_key(fcinfo, Keying::by_tenant)));
}

} // namespace idempotency::entry
