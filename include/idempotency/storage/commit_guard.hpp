// A transaction never commits a key that is already expired.
//
// A key's TTL counts from the moment its row is written, but the row
// becomes visible only when its transaction commits. If the transaction
// went on past the TTL of a key it wrote, the key would arrive expired: a
// retry would run its request again although the first run committed. The
// guard remembers the earliest expires_at each (sub)transaction wrote and
// refuses the commit (40001, so clients retry the whole transaction) when
// that moment has passed. PREPARE TRANSACTION is checked the same way;
// COMMIT PREPARED cannot be refused, so a prepared transaction committed
// after its keys' TTL commits keys that are already expired.
#pragma once

#include "idempotency/pg.hpp"

extern "C" {
#include "datatype/timestamp.h"
}

namespace idempotency::storage::commit_guard {

// Records that the current (sub)transaction wrote a key expiring at
// `expires_at`. A subtransaction that rolls back takes its keys with it.
void note_key_written(TimestampTz expires_at);

// Called by entry/transaction.cpp, the extension's transaction callbacks.
// Refuses (40001) to commit or prepare a transaction whose earliest key
// written has expired.
void at_pre_commit();
void at_transaction_end();
// While the ending subtransaction is still the current one.
void at_subtransaction_commit();
void at_subtransaction_abort();

} // namespace idempotency::storage::commit_guard
