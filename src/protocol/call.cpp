#include "idempotency/fingerprint/request_hash.hpp"
#include "idempotency/protocol/call.hpp"
#include "idempotency/protocol/claim_lock.hpp"
#include "idempotency/protocol/response_limit.hpp"
#include "idempotency/protocol/take_key.hpp"
#include "idempotency/protocol/fn.hpp"
#include "idempotency/protocol/outcome.hpp"
#include "idempotency/protocol/statement_cache.hpp"
#include "idempotency/protocol/stored_errors.hpp"
#include "idempotency/settings/settings.hpp"
#include "idempotency/stats/stats.hpp"
#include "idempotency/storage/citus.hpp"
#include "idempotency/storage/key_store.hpp"

namespace idempotency::protocol {

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

// The statement fn's text prepares, what fn receives, and the fingerprints
// the key's stored row may hold for this request.
Request prepare_request(const CallRequest &call) {
  Request request;
  request.key = call.key;
  request.statement = statement_for(call.fn, call.given);
  request.args = received_args(*request.statement, call.given);
  if (call.client_hash == nullptr)
    request.match =
        computed_match(*request.statement, call.given, request.args);
  else
    request.match = client_match(call.fn, call.client_hash);
  return request;
}

CallResult replay(const storage::KeyProbe &stored) {
  record_last_call(is_error_document(stored.response, stored.response_is_null)
                       ? Outcome::replayed_error
                       : Outcome::replayed,
                   stored.created_at, stored.expires_at);
  return CallResult{stored.response, stored.response_is_null};
}

CallResult run_and_store(const storage::KeyStore &store, const Request &request,
                         TakenKey &taken) {
  // The TTL in force when the key was claimed, whatever fn sets.
  Interval ttl = settings::ttl();
  bool response_is_null;
  bool is_error;
  int citus_guc_level = storage::citus::begin_fn();
  Datum response = run_fn_storing_errors(*request.statement, request.args,
                                         &response_is_null, &is_error);
  storage::citus::end_fn(citus_guc_level);
  check_response_size(request.key, response, response_is_null);
  const storage::KeyProbe *replaces =
      taken.stored.state == storage::KeyState::expired ? &taken.stored
                                                       : nullptr;
  storage::StoredRow times = store.store(
      request.key, storage::NewRow{request.match.fingerprint, response,
                                   response_is_null, ttl, replaces});

  // The row now shows the key as in progress to everyone else (a tenant
  // key's row does not: its claim is kept until the transaction ends).
  if (store.row_shows_in_progress())
    release(taken.claim);
  stats::count(stats::Event::ran);
  record_last_call(is_error ? Outcome::stored_error : Outcome::ran,
                   times.created_at, times.expires_at);
  return CallResult{response, response_is_null};
}

} // namespace

CallResult idempotent_call(const CallRequest &call) {
  Request request = prepare_request(call);
  storage::KeyStore store = storage::key_store_for(request.key);
  TakenKey taken = take_key(
      store, request.key, request.match, GetCurrentTransactionStartTimestamp(),
      request.key.has_tenant ? "idempotency.tenant_call"
                             : "idempotency.idempotent_call",
      nullptr);
  if (taken.replay)
    return replay(taken.stored);
  return run_and_store(store, request, taken);
}

} // namespace idempotency::protocol
