// Call statistics per database, in shared memory: one atomic add on the hot
// path. Without the library preloaded nothing is counted.
#pragma once

#include "idempotency/pg.hpp"

namespace idempotency::stats {

enum class Event { ran, replayed, conflict, mismatch, late_retry };

// shmem_request_hook and shmem_startup_hook duties, while preloading.
void request_shared_memory();
void attach_shared_memory();

void count(Event event);
void count_expired(int64 keys);

// Beyond this, a database is not counted (docs/monitoring.md).
constexpr int max_counted_databases = 128;

// A row of stats_counters(): database, ran, replayed, conflict, mismatch,
// expired, reset_at, then late_retry (0.7's tuple descriptor reads seven).
constexpr int counter_columns = 8;

// Returns how many rows were written; 0 without the library preloaded.
int copy_counters(Datum (*out)[counter_columns]);

void reset();

} // namespace idempotency::stats
