// What the expiry worker did, per database, in shared memory rather than a
// table: no WAL, no dead rows, and readable from every database.
#pragma once

#include "idempotency/pg.hpp"

extern "C" {
#include "datatype/timestamp.h"
#include "nodes/pg_list.h"
}

namespace idempotency::worker::status {

// Beyond max_databases, the least recently served one is forgotten.
constexpr int max_databases = 256;
constexpr int max_error_bytes = 256;

struct RoundStatus {
  Oid database; // InvalidOid: a free slot
  bool running;
  TimestampTz running_since;
  TimestampTz last_started;
  TimestampTz last_finished;
  int64 last_deleted;
  bool last_failed;
  char last_error[max_error_bytes];
  int64 rounds;
  int64 total_deleted;
  int64 failed_rounds;
  // Expired rows kept for refused tombstones; the first "SQLSTATE: message".
  int64 last_kept;
  char last_kept_reason[max_error_bytes];
  // Rounds that gave way to a timeout or a cancel: not failures.
  int64 skipped_rounds;
};
static_assert(std::is_trivially_destructible_v<RoundStatus>);

// shmem_request_hook and shmem_startup_hook duties, while preloading.
void request_shared_memory();
void attach_shared_memory();

void round_started(Oid database, TimestampTz at);

// Ends the round now. skipped: it gave way (error says to what), not a
// failure. kept_reason: the first refusal, nullptr when none was kept.
void round_finished(Oid database, int64 deleted, const char *error,
                    bool skipped = false, int64 kept = 0,
                    const char *kept_reason = nullptr);

// Fails the round if its worker left without saying how it went.
void round_abandoned(Oid database, const char *error);

void forget(Oid database);

void forget_all_but(const List *databases);

// Returns how many were copied, -1 without the library preloaded. No palloc
// while the status is locked: the caller provides the room.
int copy_status(RoundStatus *out);

} // namespace idempotency::worker::status
