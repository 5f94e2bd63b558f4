#include "idempotency/protocol/session.hpp"

#include "idempotency/protocol/outcome.hpp"

extern "C" {
#include "miscadmin.h"
}

namespace idempotency::protocol {

Datum current_scope_body(FunctionCallInfo) {
  return ObjectIdGetDatum(GetUserId());
}

Datum last_call_replayed_body(FunctionCallInfo fcinfo) {
  switch (last_call().outcome) {
  case Outcome::none:
    PG_RETURN_NULL();
  case Outcome::ran:
  case Outcome::stored_error:
    PG_RETURN_BOOL(false);
  case Outcome::replayed:
  case Outcome::replayed_error:
    PG_RETURN_BOOL(true);
  }
  pg_unreachable();
}

} // namespace idempotency::protocol
