// Call statistics per database, in shared memory: one atomic add on the hot
// path. Without the library preloaded nothing is counted.
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

void count(Event event);
void count_expired(int64 keys);

// Beyond this, a database is not counted (docs/monitoring.md).
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

// Returns how many were copied; 0 without the library preloaded.
int copy_counters(CounterRow *out);

void reset();

} // namespace idempotency::stats
