// Call statistics per database, in shared memory: one atomic add on the hot
// path. Without the library preloaded nothing is counted and the stats view
// shows NULLs; they start at zero after a server restart, like PostgreSQL's
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

// In the current database.
void count(Event event);
void count_expired(int64 keys);

// A database beyond this is not counted (docs/monitoring.md); slots of
// dropped databases are reused.
constexpr int max_counted_databases = 128;

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

// Copies every counted database's counters into
// out[0 .. max_counted_databases) and returns how many; 0 without the
// library preloaded.
int copy_counters(CounterRow *out);

// idempotency.stats_reset(), for this database.
void reset();

} // namespace idempotency::stats
