// A transaction never commits a key that is already expired: a key's TTL counts
// from its row's write, so a transaction that outlived it would commit a key a
// retry finds absent, and run its request again. The commit (or PREPARE
// TRANSACTION) is refused with 40001 instead; COMMIT PREPARED cannot be.
#pragma once

#include "idempotency/pg.hpp"

extern "C" {
#include "datatype/timestamp.h"
}

namespace idempotency::storage::commit_guard {

// Records that the current (sub)transaction wrote a key expiring at
// `expires_at`. A subtransaction that rolls back takes its keys with it.
void note_key_written(TimestampTz expires_at);

// The extension's transaction callbacks (entry/transaction.cpp).
void at_pre_commit();
void at_transaction_end();
// While the ending subtransaction is still the current one.
void at_subtransaction_commit();
void at_subtransaction_abort();

} // namespace idempotency::storage::commit_guard
