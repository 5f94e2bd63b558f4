// What the extension does when a transaction or subtransaction ends; key
// rows commit or roll back with the caller's transaction. Each part returns
// at once when it holds nothing: a process that never called the library
// pays a few tests per event. Invalidation callbacks stay with their caches.
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

// Its memory, claim locks and writes go with the transaction itself; a
// parallel worker's transaction ends the same way.
void forget_transaction_state() {
  fingerprint::at_transaction_end();
  protocol::claims::at_transaction_end();
  storage::commit_guard::at_transaction_end();
  storage::citus::at_transaction_end();
}

void on_transaction_event(XactEvent event, void *) {
  switch (event) {
  case XACT_EVENT_PRE_COMMIT:
    // Refusals first, the commit guard's (40001: a transaction that outlived
    // its keys' TTL is retried whole) before the claims' (25000). Then
    // Citus's two-phase decision, before Citus's own PRE_COMMIT callback:
    // callbacks run newest first, and Citus, preloaded before any library
    // that sets ProcessUtility_hook (as this one does), registers earlier.
    storage::commit_guard::at_pre_commit();
    protocol::claims::at_pre_commit();
    storage::citus::at_pre_commit();
    break;
  case XACT_EVENT_PRE_PREPARE:
    // Citus itself refuses PREPARE TRANSACTION in a coordinated transaction.
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

// The ending subtransaction is still current (GetCurrentTransactionNestLevel).
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
