// The application API, for request handlers that run several statements in
// the transaction they open. A transaction cannot commit or prepare while a
// key it claimed is neither completed nor released.
#pragma once

#include "idempotency/pg.hpp"
#include "idempotency/storage/key_store.hpp"

namespace idempotency::protocol {

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

// claim_key's client_hash is nullptr when none was given; the caller has
// cleared the session's last call before reading the arguments.
ClaimRow claim_key(const storage::KeyRef &key, text *client_hash);
void complete_key(const storage::KeyRef &key, Datum response,
                  bool response_is_null);
void release_key(const storage::KeyRef &key);
LookupRow lookup_key(const storage::KeyRef &key);
bool forget_key(const storage::KeyRef &key);

const char *lookup_state_name(LookupState state);

// refused: an error of class IK, whose SQLSTATE and message the answer keeps.
enum class BatchOutcome { claimed, replayed, refused };

struct BatchAnswer {
  BatchOutcome outcome;
  ClaimRow row;
  int sqlerrcode;
  const char *message;
};
static_assert(std::is_trivially_destructible_v<BatchAnswer>);

// claim_key for each key in a subtransaction of its own: an IK error is an
// answer. Keys are taken in digest order, so two batches that share keys
// never wait on each other in a cycle. last_call() has no row after it.
void claim_batch(const storage::KeyRef *keys, text *const *client_hashes,
                 int count, BatchAnswer *answers);

namespace claims {

void at_pre_commit();
void at_pre_prepare();
void at_transaction_end();
void at_subtransaction_abort(SubTransactionId aborted);

} // namespace claims

} // namespace idempotency::protocol
