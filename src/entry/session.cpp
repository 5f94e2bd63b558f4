#include "idempotency/entry/session.hpp"

#include "idempotency/protocol/call.hpp"

extern "C" {
#include "miscadmin.h"
}

namespace idempotency::entry {

Datum current_scope_body(FunctionCallInfo) {
  return ObjectIdGetDatum(GetUserId());
}

Datum last_call_replayed_body(FunctionCallInfo fcinfo) {
  switch (protocol::last_call().outcome) {
  case protocol::Outcome::none:
    PG_RETURN_NULL();
  case protocol::Outcome::ran:
  case protocol::Outcome::stored_error:
    PG_RETURN_BOOL(false);
  case protocol::Outcome::replayed:
  case protocol::Outcome::replayed_error:
    PG_RETURN_BOOL(true);
  }
  pg_unreachable();
}

} // namespace idempotency::entry
