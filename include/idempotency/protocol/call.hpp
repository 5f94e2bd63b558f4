// The call protocol of idempotency.idempotent_call (and tenant_call): look
// the key up, claim it, run fn, store the response - all in the caller's
// transaction.
#pragma once

#include "idempotency/fingerprint/fn_args.hpp"
#include "idempotency/pg.hpp"
#include "idempotency/protocol/claim_lock.hpp"
#include "idempotency/storage/key_store.hpp"

namespace idempotency::protocol {

// --- idempotent_call and tenant_call -----------------------------------------

// A call, its SQL arguments read and checked (entry/calls).
struct CallRequest {
  storage::KeyRef key; // a tenant key for tenant_call (key.has_tenant)
  text *fn;
  text *client_hash; // the caller's request_hash; nullptr: none given
  FnArgs given;      // fn's arguments, with the types the caller gave them
};
static_assert(std::is_trivially_destructible_v<CallRequest>);

// The response: the one fn returned and stored now, or the stored one.
struct CallResult {
  Datum response;
  bool is_null;
};

// The caller has cleared the session's last call (protocol/outcome.hpp)
// before reading the arguments: a call that fails on them has none.
CallResult idempotent_call(const CallRequest &call);

// --- taking a key ------------------------------------------------------------
//
// The one probe/claim loop of idempotent_call and claim(): the key is
// looked up, claimed (protocol/claim_lock.hpp), and looked up again, until
// it is found done (a replay) or held by this transaction.

// What taking a key found: a done row with the request's fingerprint
// (replay), or the key claimed by this transaction (proceed), ready to store.
struct TakenKey {
  bool replay;
  storage::KeyProbe stored; // replay: the row; proceed: absent or expired
  Claim claim;              // proceed: held
};

// Looks the key up and claims it (`fingerprint`: the request's, 32 raw
// bytes, as the key's row stores it), waiting up to idempotency.wait_timeout
// for another transaction that holds it. Raises IK409 (held elsewhere), IK410
// (gone: its response expired, its tombstone kept, same fingerprint), IK422
// (done or gone with another fingerprint), IK508 (held by this transaction),
// and PostgreSQL's read-only error when the key must be written on a standby.
// `command` names the SQL function in those errors; `owner` is the claim
// lock's resource owner (nullptr: the current one).
TakenKey take_key(const storage::KeyStore &store, const storage::KeyRef &key,
                  const bytea *fingerprint, TimestampTz now,
                  const char *command, ResourceOwner owner);

// IK409 for a key another transaction holds.
[[noreturn]] void report_in_progress(const storage::KeyRef &key);

} // namespace idempotency::protocol
