// Stored errors: with idempotency.store_errors set, an error of a listed
// SQLSTATE raised by fn is the call's outcome. fn then runs in a
// subtransaction, so that the error undoes fn's effects while the caller's
// transaction goes on to store the error as the response:
//
//   {"error": {"sqlstate": "P0001", "message": "...", "detail": null,
//              "hint": null}}
//
// With the setting empty fn runs as it always did, without a subtransaction.
#pragma once

#include "idempotency/protocol/fn.hpp"

#include "idempotency/pg.hpp"
#include "idempotency/protocol/fn.hpp"

namespace idempotency::protocol {

// Runs fn as run_fn() does. With idempotency.store_errors set, an error of a
// listed SQLSTATE is caught, fn's effects are rolled back, and its document
// is returned with *is_error set; any other error propagates unchanged.
Datum run_fn_storing_errors(Statement &statement, const FnArgs &args,
                            bool *is_null, bool *is_error);

// Whether a stored response is an error document of the shape above.
bool is_error_document(Datum response, bool response_is_null);

} // namespace idempotency::protocol
