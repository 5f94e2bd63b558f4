// The extension's configuration parameters (GUCs), defined in _PG_init.
#pragma once

#include "pg.hpp"
#include "protocol/rules.hpp"

namespace idempotency::settings {

void define();

// idempotency.ttl: how long a key claimed now stays valid.
const Interval &ttl();

// idempotency.wait_timeout: how long a call waits for another transaction
// that holds the same key, in milliseconds; 0 answers IK409 at once.
int wait_timeout_ms();

// idempotency.store_errors: the SQLSTATEs and classes of fn errors that are
// stored as the call's outcome; empty (count 0) by default.
const SqlstateList &stored_errors();

} // namespace idempotency::settings
