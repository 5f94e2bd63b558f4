#include "protocol/session.hpp"

#include "protocol/call.hpp"

namespace idempotency::protocol {

Datum current_scope_body(FunctionCallInfo) {
  return ObjectIdGetDatum(GetUserId());
}

Datum last_call_replayed_body(FunctionCallInfo fcinfo) {
  switch (last_call()) {
  case LastCall::none:
    PG_RETURN_NULL();
  case LastCall::ran:
    PG_RETURN_BOOL(false);
  case LastCall::replayed:
    PG_RETURN_BOOL(true);
  }
  pg_unreachable();
}

} // namespace idempotency::protocol
