// The application API: idempotency for request handlers that run several
// statements and branch in application code, inside the transaction the
// handler opens.
//
//   claim(key, request_hash)  proceed (this transaction now holds the key) or
//                             replay (the stored response); take_key() as
//                             idempotent_call does
//   complete(key, response)   store the response of a key this transaction
//                             claimed
//   release(key)              let go of a claim without storing anything
//   claim_batch(keys, hashes) claim() of many keys in one statement: each
//                             key's answer, IK409/IK422/... as a row
//   lookup(key), forget(key)  the caller's own keys, for support tooling
//
// The keys a transaction holds are kept per transaction. A transaction that
// commits or prepares while holding a claimed key it has not completed fails
// (nothing of it commits); ROLLBACK TO undoes claims and completions made
// after the savepoint.
#pragma once

#include "idempotency/pg.hpp"
#include "idempotency/storage/key_store.hpp"

namespace idempotency::protocol {

// Result rows of claim() and lookup(), for the entry points to return.
struct ClaimRow {
  bool replayed;
  Datum response;
  bool response_is_null;
  bool has_times;
  TimestampTz created_at;
  TimestampTz expires_at;
};

enum class LookupState { absent, in_progress, done, expired, gone };

struct LookupRow {
  LookupState state;
  bool has_times;
  TimestampTz created_at;
  TimestampTz expires_at;
  Datum response;
  bool response_is_null;
};

// Each takes its key as entry/ read it: a tenant key (key.has_tenant) for
// the tenant_* variants. claim_key's client_hash is the caller's
// request_hash, nullptr when none was given; as for idempotent_call, the
// caller has cleared the session's last call before reading the arguments.
ClaimRow claim_key(const storage::KeyRef &key, text *client_hash);
void complete_key(const storage::KeyRef &key, Datum response,
                  bool response_is_null);
void release_key(const storage::KeyRef &key);
LookupRow lookup_key(const storage::KeyRef &key);
bool forget_key(const storage::KeyRef &key);

const char *lookup_state_name(LookupState state);

// One key's answer in claim_batch: claimed or replayed (row as claim_key
// returns it), or refused with an error of class IK (IK409, IK422, IK508,
// ...), whose SQLSTATE and message it keeps.
enum class BatchOutcome { claimed, replayed, refused };

struct BatchAnswer {
  BatchOutcome outcome;
  ClaimRow row;
  int sqlerrcode;
  const char *message;
};
static_assert(std::is_trivially_destructible_v<BatchAnswer>);

// claim_key for keys[0 .. count-1] (role keys), with client_hashes[i]
// (nullptr: none), each in a subtransaction of its own so that a key
// refused with an IK error is an answer in answers[i] while the claims of
// the others stand. Any other error ends the batch, unchanged. The keys are
// taken in the order of their digests, then their positions, whatever the
// order given: two batches that share keys take them in the same order and
// so never wait on each other in a cycle. A key given twice is taken once;
// its later occurrences get what a second claim() gets (IK508 while
// claimed, the same replay or IK422 when done). last_call() has no row
// after a batch.
void claim_batch(const storage::KeyRef *keys, text *const *client_hashes,
                 int count, BatchAnswer *answers);

// The keys this transaction claimed, at its end (entry/transaction.cpp,
// the extension's transaction callbacks, calls these).
namespace claims {

// Refuse (25000) to commit or prepare while a claim is neither completed nor
// released.
void at_pre_commit();
void at_pre_prepare();
void at_transaction_end();
void at_subtransaction_abort(SubTransactionId aborted);

} // namespace claims

} // namespace idempotency::protocol
