#include "idempotency/fingerprint/request_hash.hpp"

#include "idempotency/protocol/call.hpp"
#include "idempotency/boundary/sqlstates.hpp"
#include "idempotency/protocol/claim_lock.hpp"
#include "idempotency/protocol/fn.hpp"
#include "idempotency/protocol/message_key.hpp"
#include "idempotency/protocol/outcome.hpp"
#include "idempotency/protocol/response_limit.hpp"
#include "idempotency/settings/settings.hpp"
#include "idempotency/stats/stats.hpp"
#include "idempotency/storage/citus.hpp"
#include "idempotency/storage/key_store.hpp"

extern "C" {
#include "miscadmin.h"
#include "utils/timestamp.h"
}

namespace idempotency::protocol {

// --- idempotent_call and tenant_call -----------------------------------------

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

// --- taking a key: the probe/claim loop of idempotent_call and claim() -------

namespace {

bool same_bytes(const varlena *a, const varlena *b) {
  return VARSIZE_ANY_EXHDR(a) == VARSIZE_ANY_EXHDR(b) &&
         memcmp(VARDATA_ANY(a), VARDATA_ANY(b), VARSIZE_ANY_EXHDR(a)) == 0;
}

[[noreturn]] void report_reused(const storage::KeyRef &key) {
  stats::count(stats::Event::mismatch);
  const char *shown = key_text(key);
  ereport(ERROR,
          (errcode(errcode_key_reused),
           errmsg("idempotency key \"%s\" was already used with a different "
                  "request",
                  shown),
           errdetail("A key identifies one request; its stored response "
                     "belongs to a request with another fingerprint."),
           errhint("Use a new idempotency key for a new request.")));
  pg_unreachable();
}

[[noreturn]] void report_recursion(const storage::KeyRef &key) {
  const char *shown = key_text(key);
  ereport(ERROR,
          (errcode(errcode_key_recursion),
           errmsg("idempotency key \"%s\" is already being processed by "
                  "this transaction",
                  shown),
           errdetail("The key was claimed earlier in this transaction and is "
                     "not yet complete: fn called idempotent_call with its "
                     "own key, or claim() was called twice.")));
  pg_unreachable();
}

// A retry of a key whose response is no longer kept: it ran, and must not
// run again while its tombstone lasts.
[[noreturn]] void report_gone(const storage::KeyRef &key,
                              const storage::KeyProbe &stored) {
  stats::count(stats::Event::late_retry);
  const char *shown = key_text(key);
  const char *ran_at = pstrdup(timestamptz_to_str(stored.created_at));
  const char *expired_at =
      pstrdup(timestamptz_to_str(stored.response_expired_at));
  const char *forgotten_at = pstrdup(timestamptz_to_str(stored.expires_at));
  ereport(ERROR,
          (errcode(errcode_key_gone),
           errmsg("idempotency key \"%s\" already ran at %s; its response is "
                  "no longer kept",
                  shown, ran_at),
           errdetail("Its response expired at %s; the key is remembered, and "
                     "a retry of the same request refused, until %s.",
                     expired_at, forgotten_at),
           errhint("The request must not run again. Use a new idempotency "
                   "key only for a new request.")));
  pg_unreachable();
}

TimestampTz wait_deadline() {
  int wait_ms = settings::wait_timeout_ms();
  if (wait_ms == 0)
    return 0;
  return TimestampTzPlusMilliseconds(GetCurrentTimestamp(), wait_ms);
}

} // namespace

void report_in_progress(const storage::KeyRef &key) {
  stats::count(stats::Event::conflict);
  const char *shown = key_text(key);
  ereport(ERROR, (errcode(errcode_key_in_progress),
                  errmsg("idempotency key \"%s\" is being processed by another "
                         "transaction",
                         shown),
                  errhint("Retry the request later.")));
  pg_unreachable();
}

TakenKey take_key(const storage::KeyStore &store, const storage::KeyRef &key,
                  const bytea *fingerprint, TimestampTz now,
                  const char *command, ResourceOwner owner) {
  TimestampTz deadline = wait_deadline();
  // The claim's tag is derived only when the key must be claimed: a replay,
  // the common retry, needs none.
  Claim claim{};

  // Each pass looks at the key afresh: after a wait the holder may have
  // committed (replay), rolled back (proceed), or still hold it (wait or
  // IK409).
  for (;;) {
    storage::KeyProbe stored = store.probe(key, now);
    if (stored.state == storage::KeyState::done) {
      release(claim);
      if (!same_bytes(stored.request_hash, fingerprint))
        report_reused(key);
      stats::count(stats::Event::replayed);
      return TakenKey{true, stored, claim};
    }
    if (stored.state == storage::KeyState::gone) {
      release(claim);
      if (!same_bytes(stored.request_hash, fingerprint))
        report_reused(key);
      report_gone(key, stored);
    }

    PreventCommandIfReadOnly(command);
    PreventCommandIfParallelMode(command);

    if (stored.state == storage::KeyState::in_progress) {
      release(claim);
      if (!wait_for_transaction(stored.holder, deadline))
        report_in_progress(key);
      continue;
    }

    if (claim.held)
      return TakenKey{false, stored, claim};

    claim = claim_for(key, owner);
    switch (acquire(claim, deadline)) {
    // Look again: taken, the key may have been stored meanwhile; released
    // by its holder, a replay mostly, or the key to claim.
    case ClaimResult::acquired:
    case ClaimResult::released:
      continue;
    case ClaimResult::busy:
      report_in_progress(key);
    case ClaimResult::recursive:
      report_recursion(key);
    }
  }
}

} // namespace idempotency::protocol
