// Bodies of idempotency.idempotent_call and idempotency.tenant_call: their
// SQL arguments read and checked, the call made (protocol/call), the
// response returned.
#pragma once

#include "idempotency/pg.hpp"

namespace idempotency::entry {

Datum idempotent_call_body(FunctionCallInfo fcinfo);

// The same with the tenant first, its key in idempotency.tenant_keys
// (storage/tenant_keys.hpp).
Datum tenant_call_body(FunctionCallInfo fcinfo);

} // namespace idempotency::entry
