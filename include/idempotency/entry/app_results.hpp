// Bodies of idempotency.claim, complete, release, last_call, lookup and
// forget, and of their tenant_* variants: each turns what the protocol answers
// into the SQL function's result.
#pragma once

#include "idempotency/pg.hpp"

namespace idempotency::entry {

Datum claim_body(FunctionCallInfo fcinfo);
Datum complete_body(FunctionCallInfo fcinfo);
Datum release_body(FunctionCallInfo fcinfo);
Datum last_call_body(FunctionCallInfo fcinfo);
Datum lookup_body(FunctionCallInfo fcinfo);
Datum forget_body(FunctionCallInfo fcinfo);
// idempotency.claim_batch(keys, request_hashes), complete_batch(keys,
// responses): the same for many keys in one statement.
Datum claim_batch_body(FunctionCallInfo fcinfo);
Datum complete_batch_body(FunctionCallInfo fcinfo);

// The same for tenant keys: idempotency.tenant_claim ... tenant_forget, the
// tenant first.
Datum tenant_claim_body(FunctionCallInfo fcinfo);
Datum tenant_complete_body(FunctionCallInfo fcinfo);
Datum tenant_release_body(FunctionCallInfo fcinfo);
Datum tenant_lookup_body(FunctionCallInfo fcinfo);
Datum tenant_forget_body(FunctionCallInfo fcinfo);

} // namespace idempotency::entry
