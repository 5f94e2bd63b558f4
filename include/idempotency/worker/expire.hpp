// Expiry of keys: the background worker (a launcher, and a round per
// database) and idempotency.expire().
#pragma once

#include "idempotency/pg.hpp"

namespace idempotency::worker {

// Registers the launcher; called from _PG_init while
// shared_preload_libraries is being processed (the shared memory the
// workers report to, worker/status.hpp, is requested there too).
void register_launcher();

// idempotency.expire(): one round now, in the caller's transaction; returns
// how many keys it deleted.
int64 expire_now();

} // namespace idempotency::worker
