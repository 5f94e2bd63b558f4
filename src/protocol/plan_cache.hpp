// Prepared plans of fn, kept for the life of the backend and keyed by fn's
// text and its argument types, so a statement is parsed and analysed once
// per backend rather than once per call. PostgreSQL's plan cache revalidates
// them after DDL or a change of search_path or role.
#pragma once

#include "pg.hpp"
#include "protocol/fn.hpp"

namespace idempotency::protocol {

// The plan for fn with these argument types; prepares it on first use.
// Raises 42601 unless fn is exactly one statement. Needs an SPI connection.
SPIPlanPtr fn_plan(text *fn, const FnArgs &args);

} // namespace idempotency::protocol
