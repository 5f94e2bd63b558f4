// Call statistics per database, in shared memory: how many calls ran fn,
// replayed, met IK409 or IK422, and how many keys expiry deleted.
//
// Counting is one atomic add on the hot path. The counters need the library
// preloaded; without it nothing is counted and the stats view shows NULLs.
// They start at zero after a server restart, like PostgreSQL's own
// cumulative statistics after a crash.
#pragma once

#include "idempotency/pg.hpp"

namespace idempotency::stats {

enum class Event { ran, replayed, conflict, mismatch };

// shmem_request_hook and shmem_startup_hook duties, while preloading.
void request_shared_memory();
void attach_shared_memory();

// Counts one call outcome in the current database.
void count(Event event);

// Counts keys deleted by expiry in the current database.
void count_expired(int64 keys);

// Bodies of idempotency.stats_counters() and idempotency.stats_reset().
Datum counters_body(FunctionCallInfo fcinfo);
Datum reset_body(FunctionCallInfo fcinfo);

} // namespace idempotency::stats
