// Expiry of keys: the background worker and idempotency.expire().
#pragma once

#include "idempotency/pg.hpp"

namespace idempotency::worker {

// Called from _PG_init while shared_preload_libraries is processed.
void register_launcher();

// idempotency.expire(): one round in this transaction; returns keys deleted.
int64 expire_now();

} // namespace idempotency::worker
