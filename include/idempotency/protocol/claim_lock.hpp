// Claims: who may run fn for a key right now.
//
// While a call runs fn, its key has no row yet (the row is written once, with
// the response). The claim covers that window: a transaction-level
// heavyweight lock on a tag of the database, the scope (role) and a keyed MAC
// of the key (see claim_for), taken without waiting; callers with
// idempotency.wait_timeout wait for it in a mode that does not conflict
// among waiters, so that all of them wake when the holder lets go. Once the row
// is written the row itself shows the key as in progress to others (through the
// dirty snapshot in storage::probe), so the claim is released at once. A
// transaction therefore holds at most one claim lock of idempotent_call at a
// time, however many calls it makes.
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
#include "idempotency/storage/key_store.hpp"

extern "C" {
#include "storage/lock.h"
#include "utils/resowner.h"
}

namespace idempotency::protocol {

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

} // namespace idempotency::protocol
