#include "idempotency/entry/functions.hpp"

#include "idempotency/fingerprint/key_digest.hpp"
#include "idempotency/stats/stats.hpp"
#include "idempotency/storage/keys.hpp"
#include "idempotency/storage/role_marks.hpp"
#include "idempotency/worker/expire.hpp"
#include "idempotency/worker/status.hpp"

extern "C" {
#include "commands/event_trigger.h"
#include "funcapi.h"
#include "miscadmin.h"
#include "utils/builtins.h"
#include "utils/timestamp.h"
#include "utils/tuplestore.h"
}

namespace idempotency::entry {

namespace {

enum StatusColumn {
  col_datid,
  col_running_since,
  col_last_started,
  col_last_finished,
  col_last_deleted,
  col_last_error,
  col_rounds,
  col_total_deleted,
  col_failed_rounds,
  // From 1.1 on; the 1.0 schema's tuple descriptor reads no further than
  // failed_rounds.
  col_last_kept,
  col_last_kept_reason,
  col_skipped_rounds,
  status_columns
};

Datum timestamp_or_null(TimestampTz at, bool *isnull) {
  *isnull = at == 0;
  return TimestampTzGetDatum(at);
}

void put_status_row(ReturnSetInfo *rsinfo,
                    const worker::status::RoundStatus &slot) {
  Datum values[status_columns];
  bool nulls[status_columns] = {};
  bool finished = slot.last_finished != 0;
  values[col_datid] = ObjectIdGetDatum(slot.database);
  values[col_running_since] = timestamp_or_null(
      slot.running ? slot.running_since : 0, &nulls[col_running_since]);
  values[col_last_started] =
      timestamp_or_null(slot.last_started, &nulls[col_last_started]);
  values[col_last_finished] =
      timestamp_or_null(slot.last_finished, &nulls[col_last_finished]);
  values[col_last_deleted] = Int64GetDatum(slot.last_deleted);
  nulls[col_last_deleted] = !finished;
  values[col_last_error] =
      slot.last_failed ? CStringGetTextDatum(slot.last_error) : (Datum)0;
  nulls[col_last_error] = !slot.last_failed;
  values[col_rounds] = Int64GetDatum(slot.rounds);
  values[col_total_deleted] = Int64GetDatum(slot.total_deleted);
  values[col_failed_rounds] = Int64GetDatum(slot.failed_rounds);
  values[col_last_kept] = Int64GetDatum(slot.last_kept);
  nulls[col_last_kept] = !finished;
  bool kept_reason = slot.last_kept_reason[0] != '\0';
  values[col_last_kept_reason] =
      kept_reason ? CStringGetTextDatum(slot.last_kept_reason) : (Datum)0;
  nulls[col_last_kept_reason] = !kept_reason;
  values[col_skipped_rounds] = Int64GetDatum(slot.skipped_rounds);
  tuplestore_putvalues(rsinfo->setResult, rsinfo->setDesc, values, nulls);
}

// late_retries comes last: the 0.7 schema declares the first seven columns
// only, and its tuple descriptor reads no further.
constexpr int counter_columns = 8;

void put_counter_row(ReturnSetInfo *rsinfo, const stats::CounterRow &row) {
  Datum values[counter_columns];
  bool nulls[counter_columns] = {};
  values[0] = ObjectIdGetDatum(row.database);
  values[1] = Int64GetDatum(row.ran);
  values[2] = Int64GetDatum(row.replayed);
  values[3] = Int64GetDatum(row.conflict);
  values[4] = Int64GetDatum(row.mismatch);
  values[5] = Int64GetDatum(row.expired);
  values[6] = TimestampTzGetDatum(row.reset_at);
  values[7] = Int64GetDatum(row.late_retry);
  tuplestore_putvalues(rsinfo->setResult, rsinfo->setDesc, values, nulls);
}

} // namespace

Datum expire_body(FunctionCallInfo) {
  PreventCommandDuringRecovery("idempotency.expire()");
  PreventCommandIfReadOnly("idempotency.expire()");
  PreventCommandIfParallelMode("idempotency.expire()");
  PG_RETURN_INT64(worker::expire_now());
}

// One row per remembered database.
Datum expiry_status_body(FunctionCallInfo fcinfo) {
  auto *copy = static_cast<worker::status::RoundStatus *>(palloc(
      sizeof(worker::status::RoundStatus) * worker::status::max_databases));
  int count = worker::status::copy_status(copy);
  if (count < 0)
    ereport(ERROR, (errcode(ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE),
                    errmsg("the idempotency expiry worker is not running"),
                    errhint("Add idempotency to shared_preload_libraries and "
                            "restart the server.")));
  InitMaterializedSRF(fcinfo, 0);
  auto *rsinfo = reinterpret_cast<ReturnSetInfo *>(fcinfo->resultinfo);
  for (int i = 0; i < count; i++)
    put_status_row(rsinfo, copy[i]);
  return (Datum)0;
}

// One row per counted database; this database always has one when the
// counters exist.
Datum stats_counters_body(FunctionCallInfo fcinfo) {
  InitMaterializedSRF(fcinfo, 0);
  auto *rsinfo = reinterpret_cast<ReturnSetInfo *>(fcinfo->resultinfo);
  auto *rows = static_cast<stats::CounterRow *>(
      palloc(sizeof(stats::CounterRow) * stats::max_counted_databases));
  int count = stats::copy_counters(rows);
  for (int i = 0; i < count; i++)
    put_counter_row(rsinfo, rows[i]);
  return (Datum)0;
}

// Zeroes this database's counters.
Datum stats_reset_body(FunctionCallInfo) {
  stats::reset();
  PG_RETURN_VOID();
}

// Any text: the key's size limits apply to calls, not to the keys a DBA
// looks up.
Datum key_digest_body(FunctionCallInfo fcinfo) {
  PG_RETURN_BYTEA_P(fingerprint::digest_of_key(PG_GETARG_TEXT_PP(0)));
}

// The C functions that only schemas before 0.7 name (key_digest() and
// keys_loaded() of 0.4 to 0.6): they say how to update.
Datum schema_before_0_7_body(FunctionCallInfo) {
  storage::report_schema_before_0_7();
}

// Marks the roles that have keys; deletes the keys of roles that are gone.
Datum mark_key_roles_body(FunctionCallInfo) {
  PG_RETURN_INT64(storage::role_marks::mark_key_roles());
}

// The event trigger on ddl_command_start, for DROP OWNED only (its WHEN
// TAG): the roles come from the statement's parse tree.
Datum drop_owned_keys_body(FunctionCallInfo fcinfo) {
  if (!CALLED_AS_EVENT_TRIGGER(fcinfo))
    ereport(ERROR, (errcode(ERRCODE_E_R_I_E_TRIGGER_PROTOCOL_VIOLATED),
                    errmsg("idempotency.drop_owned_keys() must be called as an "
                           "event trigger")));
  auto *event = reinterpret_cast<EventTriggerData *>(fcinfo->context);
  if (event->parsetree != nullptr && IsA(event->parsetree, DropOwnedStmt))
    storage::role_marks::drop_owned_keys(
        castNode(DropOwnedStmt, event->parsetree)->roles);
  PG_RETURN_VOID();
}

// The event trigger on ddl_command_end, for GRANT and REVOKE only (its
// WHEN TAG): the objects come from the statement's parse tree.
Datum keep_role_marks_body(FunctionCallInfo fcinfo) {
  if (!CALLED_AS_EVENT_TRIGGER(fcinfo))
    ereport(ERROR, (errcode(ERRCODE_E_R_I_E_TRIGGER_PROTOCOL_VIOLATED),
                    errmsg("idempotency.keep_role_marks() must be called as an "
                           "event trigger")));
  auto *event = reinterpret_cast<EventTriggerData *>(fcinfo->context);
  if (event->parsetree != nullptr && IsA(event->parsetree, GrantStmt))
    storage::role_marks::keep_marks_after_grant(
        castNode(GrantStmt, event->parsetree));
  PG_RETURN_VOID();
}

} // namespace idempotency::entry
