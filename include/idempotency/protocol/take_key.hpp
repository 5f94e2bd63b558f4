// Taking a key: the one probe/claim loop of idempotent_call and claim().
// The key is looked up, claimed (protocol/claim_lock.hpp), and looked up
// again, until it is found done (a replay) or held by this transaction.
#pragma once

#include "idempotency/pg.hpp"
#include "idempotency/protocol/claim_lock.hpp"
#include "idempotency/storage/key_store.hpp"

namespace idempotency::protocol {

// The fingerprint a request is stored with (32 raw bytes), and those that a
// row stored by an earlier version may carry for the same request (nullptr
// where there is none): fingerprints of 0.3 to 0.5, which hashed text in the
// database encoding and the types the caller sent, and the client's own
// request_hash as rows from before 0.3 kept it.
// An earlier form that costs a hash is `deferred`: computed only when a
// stored row matches none of the others.
struct DeferredFingerprint {
  bytea *(*compute)(const void *context); // nullptr: none
  const void *context;
};
static_assert(std::is_trivially_destructible_v<DeferredFingerprint>);

struct RequestMatch {
  bytea *fingerprint;
  bytea *earlier[2];
  DeferredFingerprint deferred;
};

// What taking a key found: a done row with the request's fingerprint
// (replay), or the key claimed by this transaction (proceed), ready to store.
struct TakenKey {
  bool replay;
  storage::KeyProbe stored; // replay: the row; proceed: absent or expired
  Claim claim;              // proceed: held
};

// Looks the key up and claims it, waiting up to idempotency.wait_timeout for
// another transaction that holds it. Raises IK409 (held elsewhere), IK422
// (done with another fingerprint), IK508 (held by this transaction), and
// PostgreSQL's read-only error when the key must be written on a standby.
// `command` names the SQL function in those errors; `owner` is the claim
// lock's resource owner (nullptr: the current one).
TakenKey take_key(const storage::KeyStore &store, const storage::KeyRef &key,
                  const RequestMatch &request, TimestampTz now,
                  const char *command, ResourceOwner owner);

// IK409 for a key another transaction holds.
[[noreturn]] void report_in_progress(const storage::KeyRef &key);

} // namespace idempotency::protocol
