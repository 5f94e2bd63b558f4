// The call protocol of idempotency.idempotent_call: look the key up, claim
// it, run fn, store the response - all in the caller's transaction.
#pragma once

#include "idempotency/pg.hpp"

namespace idempotency::protocol {

Datum idempotent_call(FunctionCallInfo fcinfo);

// idempotency.tenant_call: the same with the tenant first, its key in
// idempotency.tenant_keys (storage/tenant_keys.hpp).
Datum tenant_call(FunctionCallInfo fcinfo);

} // namespace idempotency::protocol
