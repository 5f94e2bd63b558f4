// The request_hash computed when the caller passes NULL: SHA-256 over fn and
// each argument's schema-qualified type name and value.
#pragma once

#include "pg.hpp"
#include "protocol/fn.hpp"

namespace idempotency::fingerprint {

// Values are encoded with the type's binary send function where it has one
// (independent of DateStyle, extra_float_digits and other settings), else
// with its text output function.
text *compute_request_hash(text *fn, const protocol::FnArgs &args);

} // namespace idempotency::fingerprint
