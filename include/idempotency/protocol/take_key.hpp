// Taking a key: the one probe/claim loop of idempotent_call and claim().
// The key is looked up, claimed (protocol/claim_lock.hpp), and looked up
// again, until it is found done (a replay) or held by this transaction.
#pragma once

#include "idempotency/pg.hpp"
#include "idempotency/protocol/claim_lock.hpp"
#include "idempotency/storage/key_store.hpp"

namespace idempotency::protocol {

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
