// The expiry background worker: the launcher (worker.cpp) and the
// per-database rounds it starts (database_round.cpp).
#pragma once

namespace idempotency::worker {

// Defines the worker's GUCs; called from _PG_init, preloaded or not.
void define_settings();

// Requests the worker's shared memory and registers the launcher; called
// from _PG_init while shared_preload_libraries is being processed.
void register_launcher();

} // namespace idempotency::worker
