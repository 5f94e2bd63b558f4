// The extension's configuration parameters (GUCs), defined in _PG_init.
#pragma once

#include "idempotency/pg.hpp"

extern "C" {
#include "datatype/timestamp.h"
}

namespace idempotency {
struct SqlstateList; // settings/sqlstate_list.hpp
}

namespace idempotency::settings {

// Defines every setting. A value of the call's settings that their checks
// refuse where PostgreSQL only warns (set before the library was loaded in
// the session, or a role's or database's value when the session starts) is
// kept, and the accessors below raise its error (22023, or 42501) until the
// setting is set again: no call runs on a default nobody chose.
void define();

// How long a key claimed now stays valid: idempotency.ttl, never more than
// idempotency.max_ttl as intervals compare (a month is 30 days).
const Interval &ttl();

// When a key written at `created_at` with `ttl` (ttl() when it was claimed)
// expires: created_at + ttl, as timestamptz arithmetic computes it (months
// and days in the session's time zone), but never later than created_at +
// idempotency.max_ttl computed the same way. So max_ttl holds exactly
// whatever units either is spelled in: '1 mon' claimed on 3 December is 30
// days under the default max_ttl, not 31; '1 year' under '361 days' is 361.
TimestampTz key_expiry(TimestampTz created_at, const Interval &ttl);

// idempotency.remember: whether keys are remembered, as tombstones, after
// their responses expire (false when it is 0).
bool remember_keys();

// idempotency.remember as an interval, for statements that compute when
// tombstones go (meaningful when remember_keys()).
const Interval &remember();

// When a key whose response expired at `response_expired_at` is forgotten:
// response_expired_at + idempotency.remember (in the session's time zone,
// as timestamptz arithmetic computes it); response_expired_at itself when
// remember is 0.
TimestampTz forgotten_at(TimestampTz response_expired_at);

// How long, in microseconds of exact time, a key whose response expires at
// `expires_at` is remembered under `remember` (remember() when the key was
// claimed): the span from expires_at to expires_at + remember as
// forgotten_at() computes it (never past the end of the timestamp range);
// 0 when remember is 0. Stored with the key, so
// that every reader ends its window at the same instant whatever its own
// settings and time zone (docs/expiry.md#when-a-keys-windows-are-fixed).
int64 remember_usecs(TimestampTz expires_at, const Interval &remember);

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

// idempotency.debug_statement_hash_bits, as the mask of the bits kept: the
// backend's caches of fn statements and their parameter types (protocol/fn)
// key them by their hash ANDed with it. A developer
// setting: fewer bits make different statements share a hash, which the
// caches must then tell apart by text and argument types. Inline: it is on
// every call's path.
namespace detail {
extern uint64 statement_hash_mask;
}
inline uint64 statement_hash_mask() { return detail::statement_hash_mask; }

// idempotency.store_errors: the SQLSTATEs and classes of fn errors that are
// stored as the call's outcome; empty (count 0) by default.
const SqlstateList &stored_errors();

} // namespace idempotency::settings
