// The expiry background worker (see worker.cpp).
#pragma once

namespace idempotency::worker {

// Registers the launcher; called from _PG_init while
// shared_preload_libraries is being processed.
void register_launcher();

} // namespace idempotency::worker
