// What happens when a transaction or subtransaction ends: the extension's
// one transaction callback and one subtransaction callback
// (src/entry/transaction.cpp lists every part they call, in order).
#pragma once

namespace idempotency::entry {

// Once per process, from _PG_init.
void register_transaction_callbacks();

} // namespace idempotency::entry
