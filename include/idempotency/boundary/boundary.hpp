// The C/C++ error boundary. PostgreSQL reports errors by longjmp, C++ by
// exceptions, and neither may cross the other:
//  - every SQL-callable function is declared with IDEMPOTENCY_SQL_FUNCTION,
//    whose run_at_boundary() catches an exception that escapes the body,
//    copies its message into palloc'd memory, and raises it with ereport()
//    only after the catch block has ended (53200 for std::bad_alloc, XX000
//    otherwise);
//  - code that may be longjmp'd out of holds only trivially destructible
//    values (static_assert'ed for each struct), so a longjmp skips no
//    destructor and PostgreSQL's errors travel up unchanged. Types with
//    destructors live only in units that include no PostgreSQL header
//    (idempotency/server_free.hpp).
#pragma once

#include <exception>
#include <new>

#include "idempotency/pg.hpp"

namespace idempotency {

template <typename Body>
Datum run_at_boundary(Body &&body, FunctionCallInfo fcinfo) {
  int sqlstate = ERRCODE_INTERNAL_ERROR;
  const char *message;
  try {
    return body(fcinfo);
  } catch (const std::bad_alloc &) {
    sqlstate = ERRCODE_OUT_OF_MEMORY;
    message = "out of memory in C++ code";
  } catch (const std::exception &e) {
    message = psprintf("C++ exception: %s", e.what());
  } catch (...) {
    message = "unknown C++ exception";
  }
  ereport(ERROR, (errcode(sqlstate), errmsg("%s", message)));
  pg_unreachable();
}

} // namespace idempotency

// Declares an SQL-callable function `name` whose body is the C++ function
// `body(FunctionCallInfo) -> Datum`.
#define IDEMPOTENCY_SQL_FUNCTION(name, body)                                   \
  extern "C" {                                                                 \
  PG_FUNCTION_INFO_V1(name);                                                   \
  Datum name(PG_FUNCTION_ARGS) {                                               \
    return ::idempotency::run_at_boundary(body, fcinfo);                       \
  }                                                                            \
  }
