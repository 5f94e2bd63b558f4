// fn: the caller's one SQL statement, its arguments, and how its result
// becomes the stored jsonb response.
#pragma once

#include "idempotency/fingerprint/fn_args.hpp"
#include "idempotency/pg.hpp"

namespace idempotency::protocol {

struct Statement;

// Runs fn - the statement's plan - with the caller's rights, through SPI, and
// returns its result as jsonb in the current memory context (see
// docs/how-it-works.md, "Result to jsonb"). *is_null is set when fn returned no
// rows.
Datum run_fn(Statement &statement, const FnArgs &args, bool *is_null);

} // namespace idempotency::protocol
