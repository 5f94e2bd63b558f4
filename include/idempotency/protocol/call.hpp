// The call protocol of idempotency.idempotent_call (and tenant_call): look
// the key up, claim it, run fn, store the response - all in the caller's
// transaction. The application API (protocol/app_api.hpp) takes its keys
// the same way: the claims, the probe/claim loop, keys in messages, the
// response limit and the session's last call below serve both.
#pragma once

#include "idempotency/fingerprint/fn_args.hpp"
#include "idempotency/pg.hpp"
#include "idempotency/storage/key_store.hpp"

extern "C" {
#include "datatype/timestamp.h"
#include "storage/lock.h"
#include "utils/resowner.h"
}

namespace idempotency::protocol {

// --- idempotent_call and tenant_call -----------------------------------------

// A call, its SQL arguments read and checked (entry/functions).
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

// The caller has cleared the session's last call (see below) before reading the
// arguments: a call that fails on them has none.
CallResult idempotent_call(const CallRequest &call);

// --- claims ------------------------------------------------------------------
//
// Who may run fn for a key right now. While a call runs fn, its key has no row
// yet (the row is written once, with the response). The claim covers that
// window: a transaction-level heavyweight lock on a tag of the database, the
// scope (role) and a keyed MAC of the key (see claim_for), taken without
// waiting; callers with idempotency.wait_timeout wait for it in a mode that
// does not conflict among waiters, so that all of them wake when the holder
// lets go. Once the row is written the row itself shows the key as in progress
// to others (through the dirty snapshot in storage::probe), so the claim is
// released at once. A transaction therefore holds at most one claim lock of
// idempotent_call at a time, however many calls it makes.
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

struct Claim {
  LOCKTAG tag;
  bool held;
  ResourceOwner owner; // nullptr: the current resource owner
};
static_assert(std::is_trivially_destructible_v<Claim>);

// released: another transaction held the claim and let go of it (committed,
// rolled back, stored the key's row or released it); look at the key again.
enum class ClaimResult { acquired, released, busy, recursive };

Claim claim_for(const storage::KeyRef &key, ResourceOwner owner = nullptr);

// Whether another transaction holds the key's claim right now.
bool claimed_elsewhere(const storage::KeyRef &key);

// Takes the claim. With deadline 0, answers busy at once when another
// transaction holds it; otherwise waits until the holder lets go of it
// (released), together with every other caller waiting for it, or until the
// deadline (busy). Answers recursive when this transaction already holds it
// (the same key inside its own fn).
ClaimResult acquire(Claim &claim, TimestampTz deadline);

void release(Claim &claim);

// Waits until the transaction `holder` ends, or the deadline passes.
// Returns false on timeout.
bool wait_for_transaction(TransactionId holder, TimestampTz deadline);

// --- taking a key ------------------------------------------------------------
//
// The one probe/claim loop of idempotent_call and claim(): the key is
// looked up and claimed (above), in either order, and looked up again
// after each wait, until it is found done (a replay) or held by this
// transaction.

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
// lock's resource owner (nullptr: the current one). `expected` changes only
// the cost: a new key is cheapest claimed before it is looked up (once), a
// stored one looked up without a claim.
enum class KeyExpected { new_key, stored };
TakenKey take_key(const storage::KeyStore &store, const storage::KeyRef &key,
                  const bytea *fingerprint, TimestampTz now,
                  const char *command, ResourceOwner owner,
                  KeyExpected expected);

// IK409 for a key another transaction holds.
[[noreturn]] void report_in_progress(const storage::KeyRef &key);

// --- a key in an error message -----------------------------------------------
//
// An error message travels in the client's encoding; a key character that
// encoding cannot represent would turn the error into another one (22P05, from
// the conversion), so such characters are escaped and the SQLSTATE never
// depends on client_encoding.

// The key as a C string: as is where the client encoding can represent it;
// each character it cannot represent is written \uXXXX or \UXXXXXXXX (its
// Unicode code point) in a UTF8 database, else \xNN per byte. Looks up the
// conversion in the catalog: call it before ereport(), not inside it.
char *key_for_message(const text *key);

// key_for_message() of a key reference's text.
const char *key_text(const storage::KeyRef &key);

// --- the limit on a stored response ------------------------------------------

// 54000 when a response is larger than idempotency.max_response_size: the
// limit a superuser sets on what any role may store, through either API.
void check_response_size(const storage::KeyRef &key, Datum response,
                         bool response_is_null);

// --- the session's last call -------------------------------------------------
//
// What the last idempotent_call or claim of this session did, for
// idempotency.last_call() and last_call_replayed(): per session, replaced by
// each call, cleared when a call starts (so a call that fails leaves none).

enum class Outcome {
  none,          // no call yet, or the last one failed
  ran,           // fn ran (idempotent_call) or the key was claimed (claim)
  replayed,      // the stored response was returned
  stored_error,  // fn raised an error listed in store_errors; it was stored
  replayed_error // the stored response is a stored error
};

struct LastCall {
  Outcome outcome;
  bool has_times; // false for a claim that proceeded: nothing stored yet
  TimestampTz created_at;
  TimestampTz expires_at;
};

void clear_last_call();
void record_last_call(Outcome outcome);
void record_last_call(Outcome outcome, TimestampTz created_at,
                      TimestampTz expires_at);
const LastCall &last_call();

const char *outcome_name(Outcome outcome);

} // namespace idempotency::protocol
