// What SQL may ask about the calling session: the scope its keys belong to
// and whether its last call replayed.
#pragma once

#include "idempotency/pg.hpp"

namespace idempotency::entry {

// Body of idempotency.current_scope(): the role keys are scoped to, the
// current user (idempotency.keys' row-level security policy uses it).
Datum current_scope_body(FunctionCallInfo fcinfo);

// Body of idempotency.last_call_replayed(): true when the session's last
// completed call replayed a stored response, false when it ran fn, NULL
// before any call or after a call that raised an error.
Datum last_call_replayed_body(FunctionCallInfo fcinfo);

} // namespace idempotency::entry
