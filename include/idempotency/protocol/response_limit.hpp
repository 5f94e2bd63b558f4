// The limit a superuser sets on the size of a stored response.
#pragma once

#include "idempotency/pg.hpp"
#include "idempotency/storage/key_store.hpp"

namespace idempotency::protocol {

// 54000 when a response is larger than idempotency.max_response_size: the
// limit a superuser sets on what any role may store, through either API.
void check_response_size(const storage::KeyRef &key, Datum response,
                         bool response_is_null);

} // namespace idempotency::protocol
