// Everything the extension does when a transaction or a subtransaction
// ends, in one place: one transaction callback and one subtransaction
// callback, registered once by _PG_init, each event a case that calls the
// parts in order. Nothing is written here: key rows commit or roll back with
// the caller's transaction. The parts:
//  - storage/commit_guard: the earliest expires_at each (sub)transaction
//    wrote; a commit or PREPARE that would publish an expired key is refused
//    (40001);
//  - protocol/app_api (claims): the keys claim() holds; a commit or PREPARE
//    with a claim neither completed nor released is refused (25000);
//  - storage/citus: a transaction that wrote a key row Citus's executor did
//    not write asks Citus for two-phase commit when it is coordinated;
//  - storage/role_marks: the roles this backend knows to be marked are
//    forgotten when the transaction that recorded a mark does not commit;
//  - fingerprint: hashing contexts an error interrupted are taken back.
// Each part's functions return at once when it holds nothing, so a process
// that loaded the library and never called it (the expiry worker between
// rounds, a backend that only preloaded it) pays a few tests per event.
//
// Cache invalidation is not transaction state; its callbacks stay with the
// caches they empty, each registered at the cache's first use:
// storage/keys.cpp (relcache: what it keeps of idempotency.keys; syscache
// NAMESPACEOID: the table's OID), storage/role_marks.cpp (relcache, and
// syscache EVENTTRIGGEROID: the roles known to be marked), protocol/fn.cpp
// (syscache of types, functions, operators, casts: the parameter types
// inferred for a fn text).
#include "idempotency/fingerprint/fingerprint.hpp"

#include "idempotency/entry/module.hpp"

#include "idempotency/protocol/app_api.hpp"
#include "idempotency/storage/citus.hpp"
#include "idempotency/storage/commit_guard.hpp"
#include "idempotency/storage/role_marks.hpp"

extern "C" {
#include "access/xact.h"
}

namespace idempotency::entry {

namespace {

// Everything the transaction held ends with it (its memory, claim locks and
// writes go with the transaction itself); a parallel worker's transaction
// ends the same way (it writes no key, so the commit guard holds nothing).
void forget_transaction_state() {
  fingerprint::at_transaction_end();
  protocol::claims::at_transaction_end();
  storage::commit_guard::at_transaction_end();
  storage::citus::at_transaction_end();
}

void on_transaction_event(XactEvent event, void *) {
  switch (event) {
  case XACT_EVENT_PRE_COMMIT:
    // Refusals first, the commit guard's before the claims' (a transaction
    // that outlived its keys' TTL is retried as a whole, whatever it left
    // unfinished). Citus's two-phase decision last: it is asked only for a
    // commit that goes on, and it must come before Citus's own PRE_COMMIT
    // callback, which prepares or commits the workers' transactions.
    // PostgreSQL calls transaction callbacks newest first, and Citus
    // registers its own in its _PG_init, in the postmaster: Citus can only
    // be preloaded and refuses to load after a library that set
    // ProcessUtility_hook, as this one's _PG_init does, so it comes first in
    // shared_preload_libraries and this callback, registered later (or in
    // the backend), runs before Citus's.
    storage::commit_guard::at_pre_commit();
    protocol::claims::at_pre_commit();
    storage::citus::at_pre_commit();
    break;
  case XACT_EVENT_PRE_PREPARE:
    // As at PRE_COMMIT. Citus refuses PREPARE TRANSACTION in a coordinated
    // transaction itself.
    storage::commit_guard::at_pre_commit();
    protocol::claims::at_pre_prepare();
    break;
  case XACT_EVENT_COMMIT:
  case XACT_EVENT_PARALLEL_COMMIT:
    forget_transaction_state();
    storage::role_marks::at_commit();
    break;
  case XACT_EVENT_ABORT:
  case XACT_EVENT_PARALLEL_ABORT:
  case XACT_EVENT_PREPARE:
    // At PREPARE as at abort: a mark the prepared transaction recorded is
    // not committed yet, and ROLLBACK PREPARED may still take it.
    forget_transaction_state();
    storage::role_marks::at_abort();
    break;
  case XACT_EVENT_PARALLEL_PRE_COMMIT:
    break;
  }
}

// Runs while the ending subtransaction is still the current one: its
// nesting level is GetCurrentTransactionNestLevel().
void on_subtransaction_event(SubXactEvent event, SubTransactionId ending,
                             SubTransactionId, void *) {
  switch (event) {
  case SUBXACT_EVENT_COMMIT_SUB:
    storage::commit_guard::at_subtransaction_commit();
    break;
  case SUBXACT_EVENT_ABORT_SUB:
    fingerprint::at_subtransaction_abort();
    protocol::claims::at_subtransaction_abort(ending);
    storage::commit_guard::at_subtransaction_abort();
    storage::role_marks::at_subtransaction_abort();
    break;
  case SUBXACT_EVENT_START_SUB:
  case SUBXACT_EVENT_PRE_COMMIT_SUB:
    break;
  }
}

} // namespace

void register_transaction_callbacks() {
  RegisterXactCallback(on_transaction_event, nullptr);
  RegisterSubXactCallback(on_subtransaction_event, nullptr);
}

} // namespace idempotency::entry
