// The expiry background worker: the launcher (launcher.cpp) and the
// per-database rounds it starts (database_round.cpp).
#pragma once

namespace idempotency::worker {

// Registers the launcher; called from _PG_init while
// shared_preload_libraries is being processed (the shared memory the
// workers report to is requested there too, by entry/module.cpp).
void register_launcher();

} // namespace idempotency::worker
