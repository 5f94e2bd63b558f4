// Claims: who may run fn for a key right now.
//
// While a call runs fn, its key has no row yet (the row is written once, with
// the response). The claim covers that window: a transaction-level
// heavyweight lock on a tag of the database, the scope (role) and a keyed MAC
// of the key (see claim_for), taken without waiting. Once the row is written
// the row itself shows the key as in progress to others (through the dirty
// snapshot in storage::probe), so the claim is released at once. A transaction
// therefore holds at most one claim lock of idempotent_call at a time, however
// many calls it makes.
//
// The application API (claim/complete) keeps its claim locks until the end
// of the transaction, or until the key is completed outside any
// subtransaction: a savepoint rolled back after complete() removes the row
// again, and the lock must still cover the key then. Those locks belong to
// the transaction's resource owner (Claim::owner), whatever subtransaction
// took them, so that the application API alone decides when they go (see
// protocol/app_api).
//
// Correctness never rests on the claim: the primary key of idempotency.keys
// makes a second execution of one key impossible to commit. The claim only
// turns what would be a wait inside the unique index into an immediate IK409.
#pragma once

#include "idempotency/pg.hpp"
#include "idempotency/storage/keys.hpp"

namespace idempotency::protocol {

struct Claim {
  LOCKTAG tag;
  bool held;
  ResourceOwner owner; // nullptr: the current resource owner
};
static_assert(std::is_trivially_destructible_v<Claim>);

enum class ClaimResult { acquired, busy, recursive };

Claim claim_for(const storage::KeyRef &key, ResourceOwner owner = nullptr);

// Whether another transaction holds the key's claim right now.
bool claimed_elsewhere(const storage::KeyRef &key);

// Takes the claim. With deadline 0, answers busy at once when another
// transaction holds it; otherwise waits until the deadline. Answers recursive
// when this transaction already holds it (the same key inside its own fn).
ClaimResult acquire(Claim &claim, TimestampTz deadline);

void release(Claim &claim);

// Waits until the transaction `holder` ends, or the deadline passes.
// Returns false on timeout.
bool wait_for_transaction(TransactionId holder, TimestampTz deadline);

// --- Taking a key: the one probe/claim loop of idempotent_call and claim --

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
TakenKey take_key(const storage::KeyTable &table, const storage::KeyRef &key,
                  const RequestMatch &request, TimestampTz now,
                  const char *command, ResourceOwner owner);

// The key argument `argno` of an SQL function: 22004 when NULL, 22023 when
// empty or over max_key_bytes (checked before the value is read).
storage::KeyRef key_argument(FunctionCallInfo fcinfo, int argno);

// How an SQL function names its key: by key alone (idempotency.keys), or by
// tenant and key, the tenant first (the tenant_* functions, whose keys live
// in idempotency.tenant_keys). The arguments after the key shift by one.
enum class Keying { by_role, by_tenant };

constexpr int key_argno(Keying keying) {
  return keying == Keying::by_tenant ? 1 : 0;
}

// The key of a call, read as `keying` says: key_argument, and for tenant
// keys the tenant (22004 when NULL, 42804 when its type is unknown).
storage::KeyRef request_key(FunctionCallInfo fcinfo, Keying keying);

const char *key_text(const storage::KeyRef &key);

// 54000 when a response is larger than idempotency.max_response_size: the
// limit a superuser sets on what any role may store, through either API.
void check_response_size(const storage::KeyRef &key, Datum response,
                         bool response_is_null);

// IK409 for a key another transaction holds.
pg_attribute_noreturn() void report_in_progress(const storage::KeyRef &key);

} // namespace idempotency::protocol
