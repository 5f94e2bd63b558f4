// The C/C++ error boundary: neither PostgreSQL's longjmp nor a C++ exception
// may cross the other. run_at_boundary() turns an exception escaping an
// SQL-callable function into an ERROR raised after the catch block ends
// (53200 for std::bad_alloc, XX000 otherwise). Code a longjmp may leave holds
// only trivially destructible values, so PostgreSQL's errors pass unchanged;
// types with destructors live in server-free units (server_free.hpp).
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
}

} // namespace idempotency

// Declares SQL-callable `name` with body `body(FunctionCallInfo) -> Datum`.
#define IDEMPOTENCY_SQL_FUNCTION(name, body)                                   \
  extern "C" {                                                                 \
  PG_FUNCTION_INFO_V1(name);                                                   \
  Datum name(PG_FUNCTION_ARGS) {                                               \
    return ::idempotency::run_at_boundary(body, fcinfo);                       \
  }                                                                            \
  }
