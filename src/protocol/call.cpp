#include "idempotency/fingerprint/request_hash.hpp"
#include "idempotency/protocol/call.hpp"
#include "idempotency/protocol/claim_lock.hpp"
#include "idempotency/protocol/key_arguments.hpp"
#include "idempotency/protocol/response_limit.hpp"
#include "idempotency/protocol/take_key.hpp"
#include "idempotency/protocol/fn.hpp"
#include "idempotency/protocol/outcome.hpp"
#include "idempotency/protocol/statement_cache.hpp"
#include "idempotency/protocol/stored_errors.hpp"
#include "idempotency/settings/settings.hpp"
#include "idempotency/stats/stats.hpp"
#include "idempotency/storage/citus.hpp"
#include "idempotency/storage/keys.hpp"

namespace idempotency::protocol {

namespace call_args {

// After the key (and, for tenant_call, the tenant before it).
constexpr int arg_request_hash = 1;
constexpr int arg_fn = 2;
constexpr int first_fn_arg = 3;

} // namespace call_args

namespace {

struct Request {
  storage::KeyRef key;
  RequestMatch match;
  FnArgs args;
  Statement *statement;
};
static_assert(std::is_trivially_destructible_v<Request>);

// The fingerprint of a call whose client passed its own request_hash: fn
// and the client's text, framed, so that the same key and hash with another
// fn is another request. Rows stored before this framing hold the client's
// text itself; the request also matches those.
RequestMatch client_match(text *fn, text *client_hash) {
  fingerprint::ClientFingerprints client =
      fingerprint::client_fingerprints(fn, client_hash);
  return RequestMatch{
      client.current,
      {client.earlier, fingerprint::legacy_client_fingerprint(client_hash)},
      {}};
}

// The form rows stored before 0.6 hold: the caller's types and values,
// text in the database encoding.
struct EarlierRequest {
  const Statement *statement;
  FnArgs given;
};
static_assert(std::is_trivially_destructible_v<EarlierRequest>);

bytea *earlier_fingerprint(const void *context) {
  const auto *request = static_cast<const EarlierRequest *>(context);
  return fingerprint::request_hash(
      request->statement->earlier_prefix, request->statement->earlier_encoders,
      request->given, fingerprint::TextForm::database);
}

// The fingerprint of what fn receives; where rows stored before 0.6 may hold
// another one for the same request, that one when a stored row asks for it.
RequestMatch computed_match(const Statement &statement, const FnArgs &given,
                            const FnArgs &received) {
  RequestMatch match{fingerprint::request_hash(statement.fingerprint_prefix,
                                               statement.encoders, received,
                                               fingerprint::TextForm::utf8),
                     {nullptr, nullptr},
                     {}};
  if (statement.earlier_differs) {
    auto *earlier =
        static_cast<EarlierRequest *>(palloc(sizeof(EarlierRequest)));
    *earlier = EarlierRequest{&statement, given};
    match.deferred = DeferredFingerprint{earlier_fingerprint, earlier};
  }
  return match;
}

// Validates the arguments; the key's size is checked before it is read.
Request read_request(FunctionCallInfo fcinfo, Keying keying) {
  storage::KeyRef key = request_key(fcinfo, keying);
  int shift = key_argno(keying);
  int arg_request_hash = shift + call_args::arg_request_hash;
  int arg_fn = shift + call_args::arg_fn;
  if (PG_ARGISNULL(arg_fn))
    ereport(ERROR, (errcode(ERRCODE_NULL_VALUE_NOT_ALLOWED),
                    errmsg("fn must not be null")));

  Request request;
  request.key = key;
  text *fn = PG_GETARG_TEXT_PP(arg_fn);
  FnArgs given = collect_args(fcinfo, shift + call_args::first_fn_arg);
  request.statement = statement_for(fn, given);
  request.args = received_args(*request.statement, given);
  if (PG_ARGISNULL(arg_request_hash))
    request.match = computed_match(*request.statement, given, request.args);
  else
    request.match = client_match(fn, PG_GETARG_TEXT_PP(arg_request_hash));
  return request;
}

Datum replay(const storage::KeyProbe &stored, FunctionCallInfo fcinfo) {
  record_last_call(is_error_document(stored.response, stored.response_is_null)
                       ? Outcome::replayed_error
                       : Outcome::replayed,
                   stored.created_at, stored.expires_at);
  if (stored.response_is_null)
    PG_RETURN_NULL();
  return stored.response;
}

Datum run_and_store(const storage::KeyTable &table, const Request &request,
                    TakenKey &taken, FunctionCallInfo fcinfo) {
  // The TTL in force when the key was claimed, whatever fn sets.
  Interval ttl = settings::ttl();
  bool response_is_null;
  bool is_error;
  int citus_guc_level = storage::citus::begin_fn();
  Datum response = run_fn_storing_errors(*request.statement, request.args,
                                         &response_is_null, &is_error);
  storage::citus::end_fn(citus_guc_level);
  check_response_size(request.key, response, response_is_null);
  storage::StoredRow times = storage::store(
      table, request.key, request.match.fingerprint, response, response_is_null,
      ttl,
      taken.stored.state == storage::KeyState::expired ? &taken.stored.row
                                                       : nullptr);

  // The row now shows the key as in progress to everyone else (a tenant
  // key's row does not: its claim is kept until the transaction ends).
  if (storage::row_shows_in_progress(table))
    release(taken.claim);
  stats::count(stats::Event::ran);
  record_last_call(is_error ? Outcome::stored_error : Outcome::ran,
                   times.created_at, times.expires_at);
  if (response_is_null)
    PG_RETURN_NULL();
  return response;
}

} // namespace

namespace {

Datum call_keyed(FunctionCallInfo fcinfo, Keying keying) {
  clear_last_call();
  Request request = read_request(fcinfo, keying);
  storage::KeyTable table = storage::table_for(request.key);
  TakenKey taken = take_key(
      table, request.key, request.match, GetCurrentTransactionStartTimestamp(),
      keying == Keying::by_tenant ? "idempotency.tenant_call"
                                  : "idempotency.idempotent_call",
      nullptr);
  if (taken.replay)
    return replay(taken.stored, fcinfo);
  return run_and_store(table, request, taken, fcinfo);
}

} // namespace

Datum idempotent_call(FunctionCallInfo fcinfo) {
  return call_keyed(fcinfo, Keying::by_role);
}

Datum tenant_call(FunctionCallInfo fcinfo) {
  return call_keyed(fcinfo, Keying::by_tenant);
}

} // namespace idempotency::protocol
