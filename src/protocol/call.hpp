// The call protocol of idempotency.idempotent_call: look the key up, claim
// it, run fn, store the response - all in the caller's transaction.
#pragma once

#include "pg.hpp"

namespace idempotency::protocol {

Datum idempotent_call(FunctionCallInfo fcinfo);

} // namespace idempotency::protocol
