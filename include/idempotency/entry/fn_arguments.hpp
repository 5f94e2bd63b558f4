// fn's arguments, as the SQL function idempotent_call (or tenant_call)
// received them after fn.
#pragma once

#include "idempotency/fingerprint/fn_args.hpp"
#include "idempotency/pg.hpp"

namespace idempotency::entry {

// The arguments after the first `first` ones, as bound to $1 ... $n. Handles
// both a spread VARIADIC "any" list and an explicit VARIADIC array; an
// untyped literal ('abc') binds as text.
FnArgs fn_arguments(FunctionCallInfo fcinfo, int first);

} // namespace idempotency::entry
