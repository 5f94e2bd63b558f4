// The extension's configuration parameters (GUCs), defined in _PG_init.
#pragma once

#include "pg.hpp"

namespace idempotency {
struct SqlstateList; // settings/sqlstate_list.hpp
}

namespace idempotency::settings {

void define();

// How long a key claimed now stays valid: idempotency.ttl, never more than
// idempotency.max_ttl.
const Interval &ttl();

// idempotency.wait_timeout: how long a call waits for another transaction
// that holds the same key, in milliseconds; 0 answers IK409 at once.
int wait_timeout_ms();

// idempotency.expire_interval, seconds; 0 turns the expiry worker off.
int expire_interval_seconds();
// idempotency.expire_batch_size: keys per batch (one worker transaction).
int expire_batch_size();
// idempotency.expire_rate: expired keys per second a worker deletes at most;
// 0 sets no limit.
int expire_rate();

// idempotency.max_response_size: the largest response stored, in bytes.
Size max_response_bytes();

// idempotency.store_errors: the SQLSTATEs and classes of fn errors that are
// stored as the call's outcome; empty (count 0) by default.
const SqlstateList &stored_errors();

} // namespace idempotency::settings
