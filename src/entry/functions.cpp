// Every SQL-callable function: bodies read their SQL arguments, call the
// layer below with plain values and build the result (fcinfo stays here);
// declarations follow in the scripts' order. CREATE EXTENSION fails on a C
// symbol a script names and this file lacks, so symbols only pre-0.7 schemas
// name stay, refusing with how to update (pg_upgrade and restores load them).
#include "idempotency/protocol/rules.hpp"

#include "idempotency/boundary/boundary.hpp"
#include "idempotency/fingerprint/key_digest.hpp"
#include "idempotency/protocol/app_api.hpp"
#include "idempotency/protocol/call.hpp"
#include "idempotency/protocol/loaded_rows.hpp"
#include "idempotency/stats/stats.hpp"
#include "idempotency/storage/keys.hpp"
#include "idempotency/storage/role_marks.hpp"
#include "idempotency/storage/secrets.hpp"
#include "idempotency/worker/expire.hpp"
#include "idempotency/worker/status.hpp"

extern "C" {
#include "access/detoast.h"
#include "catalog/pg_type.h"
#include "commands/event_trigger.h"
#include "funcapi.h"
#include "mb/pg_wchar.h"
#include "miscadmin.h"
#include "utils/array.h"
#include "utils/builtins.h"
#include "utils/lsyscache.h"
#include "utils/timestamp.h"
#include "utils/tuplestore.h"
}

namespace idempotency::entry {

namespace {

// By key alone (idempotency.keys), or by tenant and key, the tenant first
// (idempotency.tenant_keys): the value is the key's argument number.
enum Keying { by_role, by_tenant };

// A text sized like a key (`what` names it): 22004 when NULL, 22023 when
// empty or over max_key_bytes in UTF-8, so that a dump, replication or
// pg_upgrade into another encoding accepts it again. Over the limit times the
// encoding's longest character, it is too long in UTF-8 too: refused unread.
text *sized_text(NullableDatum arg, const char *what) {
  if (arg.isnull)
    ereport(ERROR, (errcode(ERRCODE_NULL_VALUE_NOT_ALLOWED),
                    errmsg("%s must not be null", what)));
  Size stored = toast_raw_datum_size(arg.value) - VARHDRSZ;
  Size counted = stored;
  text *sized = nullptr;
  if (stored <= max_key_bytes * pg_database_encoding_max_length()) {
    sized = DatumGetTextPP(arg.value);
    counted = fingerprint::utf8_length(VARDATA_ANY(sized), stored);
  }
  KeyCheck check = check_key_size(counted);
  if (check == KeyCheck::empty)
    ereport(ERROR, (errcode(ERRCODE_INVALID_PARAMETER_VALUE),
                    errmsg("%s must not be empty", what)));
  if (check == KeyCheck::too_long)
    ereport(ERROR,
            (errcode(ERRCODE_INVALID_PARAMETER_VALUE),
             errmsg("%s is %zu bytes long, the limit is %zu", what,
                    (size_t)counted, max_key_bytes),
             counted != stored
                 ? errdetail("The limit counts bytes of UTF-8; in the "
                             "database encoding %s it is %zu bytes long.",
                             GetDatabaseEncodingName(), (size_t)stored)
                 : 0));
  return sized;
}

// A key, with the digest its table holds.
storage::KeyRef key_ref(NullableDatum arg, Keying keying) {
  storage::KeyRef ref{};
  ref.scope = GetUserId();
  ref.key = sized_text(arg, "idempotency key");
  ref.digest = keying == Keying::by_tenant
                   ? fingerprint::tenant_digest_of_key(ref.key)
                   : fingerprint::digest_of_key(ref.key);
  return ref;
}

// For tenant keys the tenant first: 22004 when NULL, 42804 when untyped.
storage::KeyRef request_key(FunctionCallInfo fcinfo, Keying keying) {
  if (keying == Keying::by_role)
    return key_ref(fcinfo->args[0], keying);
  if (PG_ARGISNULL(0))
    ereport(ERROR, (errcode(ERRCODE_NULL_VALUE_NOT_ALLOWED),
                    errmsg("tenant must not be null")));
  Oid tenant_type = get_fn_expr_argtype(fcinfo->flinfo, 0);
  if (!OidIsValid(tenant_type) || tenant_type == UNKNOWNOID)
    ereport(ERROR,
            (errcode(ERRCODE_DATATYPE_MISMATCH), errmsg("tenant has no type"),
             errhint("Cast the tenant to the type of the distribution "
                     "column, e.g. 42::bigint.")));
  storage::KeyRef key = key_ref(fcinfo->args[1], keying);
  key.has_tenant = true;
  key.tenant_type = tenant_type;
  key.tenant = PG_GETARG_DATUM(0);
  return key;
}

struct Elements {
  Datum *values;
  bool *nulls;
  int count;
};

// 22004 when NULL, 22023 when multidimensional or not as long as `keys`.
Elements array_argument(FunctionCallInfo fcinfo, int argno, const char *name,
                        const Elements *keys = nullptr) {
  if (PG_ARGISNULL(argno))
    ereport(ERROR, (errcode(ERRCODE_NULL_VALUE_NOT_ALLOWED),
                    errmsg("%s must not be null", name)));
  ArrayType *array = PG_GETARG_ARRAYTYPE_P(argno);
  if (ARR_NDIM(array) > 1)
    ereport(ERROR, (errcode(ERRCODE_INVALID_PARAMETER_VALUE),
                    errmsg("%s must be a one-dimensional array", name)));
  Elements elements{};
  int16 length;
  bool by_value;
  char align;
  get_typlenbyvalalign(ARR_ELEMTYPE(array), &length, &by_value, &align);
  deconstruct_array(array, ARR_ELEMTYPE(array), length, by_value, align,
                    &elements.values, &elements.nulls, &elements.count);
  if (keys != nullptr && elements.count != keys->count)
    ereport(ERROR,
            (errcode(ERRCODE_INVALID_PARAMETER_VALUE),
             errmsg("%s has %d elements and keys %d", name, elements.count,
                    keys->count),
             errdetail("Element i of %s belongs to element i of keys.", name)));
  return elements;
}

// The arguments after the first `first`, as bound to $1 ... $n: a spread
// VARIADIC "any" list (an untyped literal bound as text), or an explicit
// VARIADIC array's elements, none when it is NULL (extract_variadic_args
// answers -1). None still come in allocated arrays: callers memcpy them.
FnArgs fn_arguments(FunctionCallInfo fcinfo, int first) {
  void *none = palloc0(sizeof(Datum));
  FnArgs args{0, static_cast<Oid *>(none), static_cast<Datum *>(none),
              static_cast<bool *>(none)};
  if (PG_NARGS() > first)
    args.count = Max(extract_variadic_args(fcinfo, first, true, &args.values,
                                           &args.types, &args.nulls),
                     0);
  return args;
}

// With the row type the caller expects when it gives one: building it from
// the function's catalog entry costs more than the rest of a claim's result.
ReturnSetInfo *materialize(FunctionCallInfo fcinfo) {
  auto *result = reinterpret_cast<ReturnSetInfo *>(fcinfo->resultinfo);
  bool expected = result != nullptr && IsA(result, ReturnSetInfo) &&
                  result->expectedDesc != nullptr;
  InitMaterializedSRF(fcinfo, expected ? MAT_SRF_USE_EXPECTED_DESC : 0);
  return result;
}

// A table function's one row, or none when `values` is nullptr.
Datum one_row(FunctionCallInfo fcinfo, Datum *values, bool *nulls) {
  ReturnSetInfo *result = materialize(fcinfo);
  if (values != nullptr)
    tuplestore_putvalues(result->setResult, result->setDesc, values, nulls);
  return (Datum)0;
}

// idempotent_call and tenant_call; fn's NULL check precedes its arguments.
template <Keying keying> Datum call_body(FunctionCallInfo fcinfo) {
  protocol::clear_last_call();
  protocol::CallRequest call;
  call.key = request_key(fcinfo, keying);
  if (PG_ARGISNULL(keying + 2))
    ereport(ERROR, (errcode(ERRCODE_NULL_VALUE_NOT_ALLOWED),
                    errmsg("fn must not be null")));
  call.fn = PG_GETARG_TEXT_PP(keying + 2);
  call.given = fn_arguments(fcinfo, keying + 3);
  call.client_hash =
      PG_ARGISNULL(keying + 1) ? nullptr : PG_GETARG_TEXT_PP(keying + 1);
  protocol::CallResult result = protocol::idempotent_call(call);
  if (result.is_null)
    PG_RETURN_NULL();
  return result.response;
}

// The role keys are scoped to (idempotency.keys' row-level security policy).
Datum current_scope_body(FunctionCallInfo) {
  return ObjectIdGetDatum(GetUserId());
}

Datum last_call_replayed_body(FunctionCallInfo fcinfo) {
  protocol::Outcome outcome = protocol::last_call().outcome;
  if (outcome == protocol::Outcome::none)
    PG_RETURN_NULL();
  PG_RETURN_BOOL(outcome == protocol::Outcome::replayed ||
                 outcome == protocol::Outcome::replayed_error);
}

Datum last_call_body(FunctionCallInfo fcinfo) {
  const protocol::LastCall &last = protocol::last_call();
  if (last.outcome == protocol::Outcome::none)
    return one_row(fcinfo, nullptr, nullptr);
  Datum values[] = {CStringGetTextDatum(protocol::outcome_name(last.outcome)),
                    TimestampTzGetDatum(last.created_at),
                    TimestampTzGetDatum(last.expires_at)};
  bool nulls[] = {false, !last.has_times, !last.has_times};
  return one_row(fcinfo, values, nulls);
}

// For the calls a request's handler makes downstream (docs/downstream.md).
Datum derived_key_body(FunctionCallInfo fcinfo) {
  text *key = sized_text(fcinfo->args[0], "idempotency key");
  text *label = sized_text(fcinfo->args[1], "label");
  storage::DerivedKeySecret secret = storage::read_derived_key_secret();
  text *derived = fingerprint::derived_key(secret.bytes, sizeof secret.bytes,
                                           GetUserId(), key, label);
  explicit_bzero(secret.bytes, sizeof secret.bytes);
  PG_RETURN_TEXT_P(derived);
}

template <Keying keying> Datum claim_body(FunctionCallInfo fcinfo) {
  protocol::clear_last_call();
  storage::KeyRef key = request_key(fcinfo, keying);
  protocol::ClaimRow claimed = protocol::claim_key(
      key, PG_ARGISNULL(keying + 1) ? nullptr : PG_GETARG_TEXT_PP(keying + 1));
  Datum values[] = {BoolGetDatum(claimed.replayed), claimed.response,
                    TimestampTzGetDatum(claimed.created_at),
                    TimestampTzGetDatum(claimed.expires_at)};
  bool nulls[] = {false, claimed.response_is_null, !claimed.has_times,
                  !claimed.has_times};
  return one_row(fcinfo, values, nulls);
}

template <Keying keying> Datum complete_body(FunctionCallInfo fcinfo) {
  bool is_null = PG_ARGISNULL(keying + 1);
  protocol::complete_key(request_key(fcinfo, keying),
                         is_null ? (Datum)0 : PG_GETARG_DATUM(keying + 1),
                         is_null);
  PG_RETURN_VOID();
}

template <Keying keying> Datum release_body(FunctionCallInfo fcinfo) {
  protocol::release_key(request_key(fcinfo, keying));
  PG_RETURN_VOID();
}

template <Keying keying> Datum lookup_body(FunctionCallInfo fcinfo) {
  protocol::LookupRow found = protocol::lookup_key(request_key(fcinfo, keying));
  Datum values[] = {
      CStringGetTextDatum(protocol::lookup_state_name(found.state)),
      TimestampTzGetDatum(found.created_at),
      TimestampTzGetDatum(found.expires_at), found.response};
  bool nulls[] = {false, !found.has_times, !found.has_times,
                  found.response_is_null};
  return one_row(fcinfo, values, nulls);
}

template <Keying keying> Datum forget_body(FunctionCallInfo fcinfo) {
  PG_RETURN_BOOL(protocol::forget_key(request_key(fcinfo, keying)));
}

// Every key of a batch, checked before any is taken.
storage::KeyRef *batch_keys(const Elements &keys) {
  auto *refs = static_cast<storage::KeyRef *>(
      palloc(sizeof(storage::KeyRef) * Max(keys.count, 1)));
  for (int i = 0; i < keys.count; i++)
    refs[i] = key_ref({keys.values[i], keys.nulls[i]}, Keying::by_role);
  return refs;
}

Datum claim_batch_body(FunctionCallInfo fcinfo) {
  Elements keys = array_argument(fcinfo, 0, "keys");
  Elements hashes{};
  if (!PG_ARGISNULL(1))
    hashes = array_argument(fcinfo, 1, "request_hashes", &keys);
  storage::KeyRef *refs = batch_keys(keys);
  auto *client_hashes =
      static_cast<text **>(palloc0(sizeof(text *) * Max(keys.count, 1)));
  for (int i = 0; i < hashes.count; i++)
    if (!hashes.nulls[i])
      client_hashes[i] = DatumGetTextPP(hashes.values[i]);
  auto *answers = static_cast<protocol::BatchAnswer *>(
      palloc0(sizeof(protocol::BatchAnswer) * Max(keys.count, 1)));

  protocol::claim_batch(refs, client_hashes, keys.count, answers);

  ReturnSetInfo *result = materialize(fcinfo);
  for (int i = 0; i < keys.count; i++) {
    const protocol::BatchAnswer &answer = answers[i];
    bool refused = answer.outcome == protocol::BatchOutcome::refused;
    const protocol::ClaimRow &row = answer.row;
    const char *outcome = refused ? "refused"
                          : answer.outcome == protocol::BatchOutcome::replayed
                              ? "replayed"
                              : "claimed";
    Datum values[] = {
        Int32GetDatum(i + 1),
        keys.values[i],
        CStringGetTextDatum(outcome),
        refused ? CStringGetTextDatum(unpack_sql_state(answer.sqlerrcode))
                : (Datum)0,
        refused ? CStringGetTextDatum(answer.message) : (Datum)0,
        refused ? (Datum)0 : row.response,
        refused ? (Datum)0 : TimestampTzGetDatum(row.created_at),
        refused ? (Datum)0 : TimestampTzGetDatum(row.expires_at)};
    bool has_times = !refused && row.has_times;
    bool nulls[] = {false,      false,     false,
                    !refused,   !refused,  refused || row.response_is_null,
                    !has_times, !has_times};
    tuplestore_putvalues(result->setResult, result->setDesc, values, nulls);
  }
  return (Datum)0;
}

Datum complete_batch_body(FunctionCallInfo fcinfo) {
  Elements keys = array_argument(fcinfo, 0, "keys");
  Elements responses = array_argument(fcinfo, 1, "responses", &keys);
  storage::KeyRef *refs = batch_keys(keys);
  for (int i = 0; i < keys.count; i++)
    protocol::complete_key(refs[i], responses.values[i], responses.nulls[i]);
  PG_RETURN_VOID();
}

Datum expire_body(FunctionCallInfo) {
  PreventCommandDuringRecovery("idempotency.expire()");
  PreventCommandIfReadOnly("idempotency.expire()");
  PreventCommandIfParallelMode("idempotency.expire()");
  PG_RETURN_INT64(worker::expire_now());
}

// One row per remembered database. From last_kept on, 1.1's columns: the 1.0
// schema's tuple descriptor reads no further than failed_rounds.
Datum expiry_status_body(FunctionCallInfo fcinfo) {
  auto *copy = static_cast<worker::status::RoundStatus *>(palloc(
      sizeof(worker::status::RoundStatus) * worker::status::max_databases));
  int count = worker::status::copy_status(copy);
  if (count < 0)
    ereport(ERROR, (errcode(ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE),
                    errmsg("the idempotency expiry worker is not running"),
                    errhint("Add idempotency to shared_preload_libraries and "
                            "restart the server.")));
  ReturnSetInfo *rsinfo = materialize(fcinfo);
  for (int i = 0; i < count; i++) {
    const worker::status::RoundStatus &slot = copy[i];
    bool finished = slot.last_finished != 0;
    bool kept_reason = slot.last_kept_reason[0] != '\0';
    Datum values[] = {
        ObjectIdGetDatum(slot.database),
        TimestampTzGetDatum(slot.running_since),
        TimestampTzGetDatum(slot.last_started),
        TimestampTzGetDatum(slot.last_finished),
        Int64GetDatum(slot.last_deleted),
        slot.last_failed ? CStringGetTextDatum(slot.last_error) : (Datum)0,
        Int64GetDatum(slot.rounds),
        Int64GetDatum(slot.total_deleted),
        Int64GetDatum(slot.failed_rounds),
        Int64GetDatum(slot.last_kept),
        kept_reason ? CStringGetTextDatum(slot.last_kept_reason) : (Datum)0,
        Int64GetDatum(slot.skipped_rounds)};
    bool not_running = !slot.running || slot.running_since == 0;
    bool nulls[] = {false,     not_running,  slot.last_started == 0,
                    !finished, !finished,    !slot.last_failed,
                    false,     false,        false,
                    !finished, !kept_reason, false};
    tuplestore_putvalues(rsinfo->setResult, rsinfo->setDesc, values, nulls);
  }
  return (Datum)0;
}

Datum stats_counters_body(FunctionCallInfo fcinfo) {
  ReturnSetInfo *rsinfo = materialize(fcinfo);
  auto *rows = static_cast<Datum(*)[stats::counter_columns]>(palloc(
      sizeof(Datum) * stats::counter_columns * stats::max_counted_databases));
  int count = stats::copy_counters(rows);
  bool nulls[stats::counter_columns] = {};
  for (int i = 0; i < count; i++)
    tuplestore_putvalues(rsinfo->setResult, rsinfo->setDesc, rows[i], nulls);
  return (Datum)0;
}

Datum stats_reset_body(FunctionCallInfo) {
  stats::reset();
  PG_RETURN_VOID();
}

// Any text: the size limits apply to calls, not to keys a DBA looks up.
Datum key_digest_body(FunctionCallInfo fcinfo) {
  PG_RETURN_BYTEA_P(fingerprint::digest_of_key(PG_GETARG_TEXT_PP(0)));
}

// key_digest() and keys_loaded() of 0.4 to 0.6: they say how to update.
[[noreturn]] Datum schema_before_0_7_body(FunctionCallInfo) {
  storage::report_schema_before_0_7();
}

Datum mark_key_roles_body(FunctionCallInfo) {
  PG_RETURN_INT64(storage::role_marks::mark_key_roles());
}

// The statement an event trigger fires for; `name` is the function's.
Node *event_statement(FunctionCallInfo fcinfo, const char *name) {
  if (!CALLED_AS_EVENT_TRIGGER(fcinfo))
    ereport(ERROR, (errcode(ERRCODE_E_R_I_E_TRIGGER_PROTOCOL_VIOLATED),
                    errmsg("%s must be called as an event trigger", name)));
  return reinterpret_cast<EventTriggerData *>(fcinfo->context)->parsetree;
}

// On ddl_command_start, for DROP OWNED only (its WHEN TAG).
Datum drop_owned_keys_body(FunctionCallInfo fcinfo) {
  Node *statement = event_statement(fcinfo, "idempotency.drop_owned_keys()");
  if (statement != nullptr && IsA(statement, DropOwnedStmt))
    storage::role_marks::drop_owned_keys(
        castNode(DropOwnedStmt, statement)->roles);
  PG_RETURN_VOID();
}

// On ddl_command_end, for GRANT and REVOKE only (its WHEN TAG).
Datum keep_role_marks_body(FunctionCallInfo fcinfo) {
  Node *statement = event_statement(fcinfo, "idempotency.keep_role_marks()");
  if (statement != nullptr && IsA(statement, GrantStmt))
    storage::role_marks::keep_marks_after_grant(castNode(GrantStmt, statement));
  PG_RETURN_VOID();
}

} // namespace

} // namespace idempotency::entry

using idempotency::entry::Keying;

// clang-format off

// since 0.1
IDEMPOTENCY_SQL_FUNCTION(idempotency_current_scope, idempotency::entry::current_scope_body)
IDEMPOTENCY_SQL_FUNCTION(idempotency_idempotent_call, idempotency::entry::call_body<Keying::by_role>)
IDEMPOTENCY_SQL_FUNCTION(idempotency_last_call_replayed, idempotency::entry::last_call_replayed_body)
IDEMPOTENCY_SQL_FUNCTION(idempotency_expire, idempotency::entry::expire_body)
IDEMPOTENCY_SQL_FUNCTION(idempotency_expiry_status, idempotency::entry::expiry_status_body)

// since 0.2
IDEMPOTENCY_SQL_FUNCTION(idempotency_stats_counters, idempotency::entry::stats_counters_body)
IDEMPOTENCY_SQL_FUNCTION(idempotency_stats_reset, idempotency::entry::stats_reset_body)

// since 0.3; role_scope's I/O functions have their bodies in storage
IDEMPOTENCY_SQL_FUNCTION(idempotency_role_scope_in, idempotency::storage::role_scope_in)
IDEMPOTENCY_SQL_FUNCTION(idempotency_role_scope_out, idempotency::storage::role_scope_out)
IDEMPOTENCY_SQL_FUNCTION(idempotency_role_scope_recv, idempotency::storage::role_scope_recv)
IDEMPOTENCY_SQL_FUNCTION(idempotency_role_scope_send, idempotency::storage::role_scope_send)
IDEMPOTENCY_SQL_FUNCTION(idempotency_claim, idempotency::entry::claim_body<Keying::by_role>)
IDEMPOTENCY_SQL_FUNCTION(idempotency_complete, idempotency::entry::complete_body<Keying::by_role>)
IDEMPOTENCY_SQL_FUNCTION(idempotency_release, idempotency::entry::release_body<Keying::by_role>)
IDEMPOTENCY_SQL_FUNCTION(idempotency_last_call, idempotency::entry::last_call_body)
IDEMPOTENCY_SQL_FUNCTION(idempotency_lookup, idempotency::entry::lookup_body<Keying::by_role>)
IDEMPOTENCY_SQL_FUNCTION(idempotency_forget, idempotency::entry::forget_body<Keying::by_role>)

// since 0.4 (key_digest of 0.4 to 0.6)
IDEMPOTENCY_SQL_FUNCTION(idempotency_key_digest, idempotency::entry::schema_before_0_7_body)

// since 0.5
IDEMPOTENCY_SQL_FUNCTION(idempotency_tenant_call, idempotency::entry::call_body<Keying::by_tenant>)
IDEMPOTENCY_SQL_FUNCTION(idempotency_tenant_claim, idempotency::entry::claim_body<Keying::by_tenant>)
IDEMPOTENCY_SQL_FUNCTION(idempotency_tenant_complete, idempotency::entry::complete_body<Keying::by_tenant>)
IDEMPOTENCY_SQL_FUNCTION(idempotency_tenant_release, idempotency::entry::release_body<Keying::by_tenant>)
IDEMPOTENCY_SQL_FUNCTION(idempotency_tenant_lookup, idempotency::entry::lookup_body<Keying::by_tenant>)
IDEMPOTENCY_SQL_FUNCTION(idempotency_tenant_forget, idempotency::entry::forget_body<Keying::by_tenant>)

// since 0.6 (keys_loaded of 0.6)
IDEMPOTENCY_SQL_FUNCTION(idempotency_keys_loaded, idempotency::entry::schema_before_0_7_body)

// since 0.7: key_digest() and keys_loaded() of ordered digests
IDEMPOTENCY_SQL_FUNCTION(idempotency_ordered_key_digest, idempotency::entry::key_digest_body)
IDEMPOTENCY_SQL_FUNCTION(idempotency_ordered_keys_loaded, idempotency::protocol::keys_loaded_body)
IDEMPOTENCY_SQL_FUNCTION(idempotency_mark_key_roles, idempotency::entry::mark_key_roles_body)
IDEMPOTENCY_SQL_FUNCTION(idempotency_drop_owned_keys, idempotency::entry::drop_owned_keys_body)

// idempotency--0.7--1.0.sql
IDEMPOTENCY_SQL_FUNCTION(idempotency_keep_role_marks, idempotency::entry::keep_role_marks_body)
IDEMPOTENCY_SQL_FUNCTION(idempotency_derived_key, idempotency::entry::derived_key_body)
IDEMPOTENCY_SQL_FUNCTION(idempotency_claim_batch, idempotency::entry::claim_batch_body)
IDEMPOTENCY_SQL_FUNCTION(idempotency_complete_batch, idempotency::entry::complete_batch_body)

// clang-format on
