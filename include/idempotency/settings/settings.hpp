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

// Defines every setting. A value of the call's settings refused where
// PostgreSQL only warns (set before the library was loaded, or a role's or
// database's value) makes the accessors below raise its error (22023, or
// 42501) until the setting is set again.
void define();

// Never more than idempotency.max_ttl (a month is 30 days).
const Interval &ttl();

// created_at + ttl in timestamptz arithmetic (the session's time zone), at
// most created_at + max_ttl alike, so max_ttl holds whatever units either uses.
TimestampTz key_expiry(TimestampTz created_at, const Interval &ttl);

// Whether idempotency.remember keeps tombstones (false when it is 0).
bool remember_keys();
const Interval &remember();

// response_expired_at + idempotency.remember in timestamptz arithmetic;
// response_expired_at itself when remember is 0.
TimestampTz forgotten_at(TimestampTz response_expired_at);

// The microseconds from expires_at to expires_at + remember, as
// forgotten_at() computes them (never past the end of the timestamp range); 0
// when remember is 0. Stored with the key, so that every reader ends its
// window at the same instant (docs/expiry.md#when-a-keys-windows-are-fixed).
int64 remember_usecs(TimestampTz expires_at, const Interval &remember);

int wait_timeout_ms();
int expire_interval_seconds();
int expire_batch_size();
int expire_rate();
Size max_response_bytes();

// idempotency.debug_statement_hash_bits as a mask of the hash bits fn's
// statement caches (protocol/fn) key by. Inline: on every call's path.
namespace detail {
extern uint64 statement_hash_mask;
}
inline uint64 statement_hash_mask() { return detail::statement_hash_mask; }

// idempotency.store_errors; empty (count 0) by default.
const SqlstateList &stored_errors();

} // namespace idempotency::settings
