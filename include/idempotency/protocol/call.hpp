// idempotent_call and tenant_call: look the key up, claim it, run fn and
// store the response in the caller's transaction. The application API takes
// its keys the same way (take_key).
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

struct CallRequest {
  storage::KeyRef key; // a tenant key for tenant_call (key.has_tenant)
  text *fn;
  text *client_hash; // the caller's request_hash; nullptr: none given
  FnArgs given;      // fn's arguments, with the types the caller gave them
};
static_assert(std::is_trivially_destructible_v<CallRequest>);

struct CallResult {
  Datum response;
  bool is_null;
};

// The caller has cleared the session's last call before reading the
// arguments: a call that fails on them has none.
CallResult idempotent_call(const CallRequest &call);

// A claim covers a key while fn runs and the key has no row yet. Correctness
// never rests on it: the primary key forbids committing a second execution;
// the claim only turns a wait inside the unique index into an immediate IK409.
struct Claim {
  LOCKTAG tag;
  bool held;
  ResourceOwner owner; // nullptr: the current resource owner
};
static_assert(std::is_trivially_destructible_v<Claim>);

bool claimed_elsewhere(const storage::KeyRef &key);

void release(Claim &claim);

// proceed: the claim held, and what store_response() stores with the
// response (ttl and remember as in force when the key was claimed).
struct TakenKey {
  bool replay;
  storage::KeyProbe stored; // replay: the row; proceed: absent or expired
  Claim claim;
  bytea *fingerprint;
  Interval ttl;
  Interval remember;
};

// Looks the key up and claims it, waiting up to idempotency.wait_timeout for
// a holder, or records the replay as the session's last call; raises IK409,
// IK410, IK422, IK508 or the read-only error naming `command`. `expected`
// only changes the cost: new keys are claimed first, stored ones looked up.
enum class KeyExpected { new_key, stored };
TakenKey take_key(const storage::KeyStore &store, const storage::KeyRef &key,
                  bytea *fingerprint, const char *command, ResourceOwner owner,
                  KeyExpected expected);

// Stores a proceeding key's response; 54000 over idempotency.max_response_size.
storage::StoredRow store_response(const storage::KeyStore &store,
                                  const storage::KeyRef &key, TakenKey &taken,
                                  Datum response, bool response_is_null);

[[noreturn]] void report_in_progress(const storage::KeyRef &key);

// The key as a C string for an error message, each character the client
// encoding cannot represent escaped (\uXXXX, \UXXXXXXXX in a UTF8 database,
// else \xNN per byte): a failed conversion would turn the error into 22P05.
// Looks up the catalog: call it before ereport(), not inside it.
char *key_for_message(const text *key);

// The session's last idempotent_call or claim; cleared when a call starts,
// so a call that fails leaves none.

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
void record_last_call(const LastCall &call);
const LastCall &last_call();

const char *outcome_name(Outcome outcome);

} // namespace idempotency::protocol
