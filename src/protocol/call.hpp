// The call protocol of idempotency.idempotent_call: look the key up, claim
// it, run fn, store the response - all in the caller's transaction.
#pragma once

#include "pg.hpp"

namespace idempotency::protocol {

enum class LastCall { none, ran, replayed };

Datum idempotent_call(FunctionCallInfo fcinfo);

// What the last completed call of this session did.
LastCall last_call();

// Forgets the last call: the session starts over (DISCARD ALL, which a
// connection pooler sends before it hands the connection to a new client).
void forget_last_call();

} // namespace idempotency::protocol
