// Claims: who may run fn for a key right now.
//
// While a call runs fn, its key has no row yet (the row is written once, with
// the response). The claim covers that window: a transaction-level
// heavyweight lock on a tag derived from the database, scope and key, taken
// without waiting. Once the row is written the row itself shows the key as
// in progress to others (through the dirty snapshot in storage::probe), so
// the claim is released at once. A transaction therefore holds at most one
// claim lock at a time, however many calls it makes.
//
// Correctness never rests on the claim: the primary key of idempotency.keys
// makes a second execution of one key impossible to commit. The claim only
// turns what would be a wait inside the unique index into an immediate IK409.
#pragma once

#include "pg.hpp"
#include "storage/keys.hpp"

namespace idempotency::protocol {

struct Claim {
  LOCKTAG tag;
  bool held;
};
static_assert(std::is_trivially_destructible_v<Claim>);

enum class ClaimResult { acquired, busy, recursive };

Claim claim_for(const storage::KeyRef &key);

// Takes the claim. With deadline 0, answers busy at once when another
// transaction holds it; otherwise waits until the deadline. Answers recursive
// when this transaction already holds it (the same key inside its own fn).
ClaimResult acquire(Claim &claim, TimestampTz deadline);

void release(Claim &claim);

// Waits until the transaction `holder` ends, or the deadline passes.
// Returns false on timeout.
bool wait_for_transaction(TransactionId holder, TimestampTz deadline);

} // namespace idempotency::protocol
