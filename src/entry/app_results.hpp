// Bodies of idempotency.claim, complete, release, last_call, lookup and
// forget: each turns what the protocol answers into the SQL function's result.
#pragma once

#include "pg.hpp"

namespace idempotency::entry {

Datum claim_body(FunctionCallInfo fcinfo);
Datum complete_body(FunctionCallInfo fcinfo);
Datum release_body(FunctionCallInfo fcinfo);
Datum last_call_body(FunctionCallInfo fcinfo);
Datum lookup_body(FunctionCallInfo fcinfo);
Datum forget_body(FunctionCallInfo fcinfo);

} // namespace idempotency::entry
