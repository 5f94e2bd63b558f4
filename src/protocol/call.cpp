#include "protocol/rules.hpp"

#include "entry/settings.hpp"
#include "fingerprint/request_hash.hpp"
#include "protocol/call.hpp"
#include "protocol/claim.hpp"
#include "protocol/fn.hpp"
#include "protocol/statement_cache.hpp"
#include "stats/stats.hpp"
#include "storage/keys.hpp"

namespace idempotency::protocol {

namespace {

constexpr int arg_key = 0;
constexpr int arg_request_hash = 1;
constexpr int arg_fn = 2;
constexpr int first_fn_arg = 3;

const int errcode_key_in_progress = MAKE_SQLSTATE('I', 'K', '4', '0', '9');
const int errcode_key_reused = MAKE_SQLSTATE('I', 'K', '4', '2', '2');
const int errcode_key_recursion = MAKE_SQLSTATE('I', 'K', '5', '0', '8');

LastCall last = LastCall::none;

struct Request {
  storage::KeyRef key;
  text *request_hash;
  text *fn;
  FnArgs args;
  Statement *statement;
};

// Validates the arguments; the key's size is checked before it is read.
Request read_request(FunctionCallInfo fcinfo) {
  if (PG_ARGISNULL(arg_key))
    ereport(ERROR, (errcode(ERRCODE_NULL_VALUE_NOT_ALLOWED),
                    errmsg("idempotency key must not be null")));
  if (PG_ARGISNULL(arg_fn))
    ereport(ERROR, (errcode(ERRCODE_NULL_VALUE_NOT_ALLOWED),
                    errmsg("fn must not be null")));
  Size key_bytes = toast_raw_datum_size(PG_GETARG_DATUM(arg_key)) - VARHDRSZ;
  switch (check_key_size(key_bytes)) {
  case KeyCheck::ok:
    break;
  case KeyCheck::empty:
    ereport(ERROR, (errcode(ERRCODE_INVALID_PARAMETER_VALUE),
                    errmsg("idempotency key must not be empty")));
  case KeyCheck::too_long:
    ereport(ERROR,
            (errcode(ERRCODE_INVALID_PARAMETER_VALUE),
             errmsg("idempotency key is %zu bytes long, the limit is %zu",
                    (size_t)key_bytes, max_key_bytes)));
  }

  Request request;
  request.key.scope = GetUserId();
  request.key.key = PG_GETARG_TEXT_PP(arg_key);
  request.fn = PG_GETARG_TEXT_PP(arg_fn);
  request.args = collect_args(fcinfo, first_fn_arg);
  request.statement = statement_for(request.fn, request.args);
  request.request_hash =
      PG_ARGISNULL(arg_request_hash)
          ? fingerprint::request_hash(request.statement->fingerprint_prefix,
                                      request.statement->encoders, request.args)
          : PG_GETARG_TEXT_PP(arg_request_hash);
  return request;
}

const char *key_text(const Request &request) {
  return text_to_cstring(request.key.key);
}

bool same_text(const text *a, const text *b) {
  return VARSIZE_ANY_EXHDR(a) == VARSIZE_ANY_EXHDR(b) &&
         memcmp(VARDATA_ANY(a), VARDATA_ANY(b), VARSIZE_ANY_EXHDR(a)) == 0;
}

pg_attribute_noreturn() void report_in_progress(const Request &request) {
  stats::count(stats::Event::conflict);
  ereport(ERROR, (errcode(errcode_key_in_progress),
                  errmsg("idempotency key \"%s\" is being processed by another "
                         "transaction",
                         key_text(request)),
                  errhint("Retry the request later.")));
  pg_unreachable();
}

Datum replay(const Request &request, const storage::KeyProbe &stored,
             FunctionCallInfo fcinfo) {
  if (!same_text(stored.request_hash, request.request_hash)) {
    stats::count(stats::Event::mismatch);
    ereport(ERROR,
            (errcode(errcode_key_reused),
             errmsg("idempotency key \"%s\" was already used with a different "
                    "request",
                    key_text(request)),
             errdetail("A key identifies one request; its stored response "
                       "belongs to a request with another fingerprint."),
             errhint("Use a new idempotency key for a new request.")));
  }
  stats::count(stats::Event::replayed);
  last = LastCall::replayed;
  if (stored.response_is_null)
    PG_RETURN_NULL();
  return stored.response;
}

Datum run_and_store(const storage::KeyTable &table, const Request &request,
                    Claim &claim, const ItemPointerData *expired_row,
                    FunctionCallInfo fcinfo) {
  bool response_is_null;
  Datum response = run_fn(*request.statement, request.args, &response_is_null);
  storage::store(table, request.key, request.request_hash, response,
                 response_is_null, settings::ttl(), expired_row);

  // The row now shows the key as in progress to everyone else.
  release(claim);
  stats::count(stats::Event::ran);
  last = LastCall::ran;
  if (response_is_null)
    PG_RETURN_NULL();
  return response;
}

TimestampTz wait_deadline() {
  int wait_ms = settings::wait_timeout_ms();
  if (wait_ms == 0)
    return 0;
  return TimestampTzPlusMilliseconds(GetCurrentTimestamp(), wait_ms);
}

} // namespace

Datum idempotent_call(FunctionCallInfo fcinfo) {
  last = LastCall::none;
  Request request = read_request(fcinfo);
  TimestampTz now = GetCurrentTransactionStartTimestamp();
  TimestampTz deadline = wait_deadline();
  // The claim's tag is derived only when the key must be claimed: a replay,
  // the common retry, needs none.
  Claim claim{};
  storage::KeyTable table = storage::key_table();

  // Each pass looks at the key afresh: after a wait the holder may have
  // committed (replay), rolled back (run), or still hold it (wait or IK409).
  for (;;) {
    storage::KeyProbe stored = storage::probe(table, request.key, now);
    if (stored.state == storage::KeyState::done) {
      release(claim);
      return replay(request, stored, fcinfo);
    }

    PreventCommandIfReadOnly("idempotency.idempotent_call");
    PreventCommandIfParallelMode("idempotency.idempotent_call");

    if (stored.state == storage::KeyState::in_progress) {
      release(claim);
      if (!wait_for_transaction(stored.holder, deadline))
        report_in_progress(request);
      continue;
    }

    if (claim.held)
      return run_and_store(
          table, request, claim,
          stored.state == storage::KeyState::expired ? &stored.row : nullptr,
          fcinfo);

    claim = claim_for(request.key);
    switch (acquire(claim, deadline)) {
    case ClaimResult::acquired:
      continue; // look again: the key may have been stored meanwhile
    case ClaimResult::busy:
      report_in_progress(request);
    case ClaimResult::recursive:
      ereport(ERROR,
              (errcode(errcode_key_recursion),
               errmsg("idempotency key \"%s\" is already being processed by "
                      "this transaction",
                      key_text(request)),
               errdetail("fn called idempotent_call with its own key.")));
    }
  }
}

LastCall last_call() { return last; }

} // namespace idempotency::protocol
