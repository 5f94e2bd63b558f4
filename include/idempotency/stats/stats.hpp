// Call statistics per database, in shared memory: how many calls ran fn,
// replayed, met IK409, IK410 or IK422, and how many keys expiry deleted.
//
// Counting is one atomic add on the hot path. The counters need the library
// preloaded; without it nothing is counted and the stats view shows NULLs.
// They start at zero after a server restart, like PostgreSQL's own
// cumulative statistics after a crash.
#pragma once

#include "idempotency/pg.hpp"

extern "C" {
#include "datatype/timestamp.h"
}

namespace idempotency::stats {

enum class Event { ran, replayed, conflict, mismatch, late_retry };

// shmem_request_hook and shmem_startup_hook duties, while preloading.
void request_shared_memory();
void attach_shared_memory();

// Counts one call outcome in the current database.
void count(Event event);

// Counts keys deleted by expiry in the current database.
void count_expired(int64 keys);

// Databases counted at once; a database beyond this is not counted (see
// docs/monitoring.md). Slots of dropped databases are reused.
constexpr int max_counted_databases = 128;

// One database's counters, as idempotency.stats_counters() shows them.
struct CounterRow {
  Oid database;
  int64 ran;
  int64 replayed;
  int64 conflict;
  int64 mismatch;
  int64 expired;
  TimestampTz reset_at;
  int64 late_retry;
};
static_assert(std::is_trivially_destructible_v<CounterRow>);

// Copies the counters of every counted database into
// out[0 .. max_counted_databases) and returns how many; 0 without the
// library preloaded.
int copy_counters(CounterRow *out);

// Zeroes this database's counters (idempotency.stats_reset()).
void reset();

} // namespace idempotency::stats
