#include "idempotency/fingerprint/request_hash.hpp"
#include "idempotency/protocol/call.hpp"
#include "idempotency/protocol/claim_lock.hpp"
#include "idempotency/protocol/response_limit.hpp"
#include "idempotency/protocol/take_key.hpp"
#include "idempotency/protocol/fn.hpp"
#include "idempotency/protocol/outcome.hpp"
#include "idempotency/settings/settings.hpp"
#include "idempotency/stats/stats.hpp"
#include "idempotency/storage/citus.hpp"
#include "idempotency/storage/key_store.hpp"

namespace idempotency::protocol {

namespace {

struct Request {
  storage::KeyRef key;
  bytea *fingerprint; // 32 raw bytes, as the key's row stores it
  FnArgs args;
  Statement *statement;
};
static_assert(std::is_trivially_destructible_v<Request>);

// The statement fn's text prepares, what fn receives, and the request's
// fingerprint: of fn, the types fn receives and their values, or, when the
// client passed its own request_hash, of fn and the client's text (the same
// key and hash with another fn is another request).
Request prepare_request(const CallRequest &call) {
  Request request;
  request.key = call.key;
  request.statement = statement_for(call.fn, call.given);
  request.args = received_args(*request.statement, call.given);
  request.fingerprint =
      call.client_hash == nullptr
          ? fingerprint::request_hash(request.statement->fingerprint_prefix,
                                      request.statement->encoders, request.args)
          : fingerprint::client_fingerprint(call.fn, call.client_hash);
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
  // The TTL and remember window in force when the key was claimed,
  // whatever fn sets.
  Interval ttl = settings::ttl();
  Interval remember = settings::remember();
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
      request.key, storage::NewRow{request.fingerprint, response,
                                   response_is_null, ttl, remember, replaces,
                                   GetCurrentTransactionStartTimestamp()});

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
  TakenKey taken =
      take_key(store, request.key, request.fingerprint,
               GetCurrentTransactionStartTimestamp(),
               request.key.has_tenant ? "idempotency.tenant_call"
                                      : "idempotency.idempotent_call",
               nullptr);
  if (taken.replay)
    return replay(taken.stored);
  return run_and_store(store, request, taken);
}

} // namespace idempotency::protocol
