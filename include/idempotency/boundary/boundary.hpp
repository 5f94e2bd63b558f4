// The C/C++ error boundary, written once.
//
// PostgreSQL reports errors by longjmp; C++ by exceptions. Neither may cross
// the other:
//
//  * SQL -> C++: every SQL-callable function is declared with
//    IDEMPOTENCY_SQL_FUNCTION, which runs its body inside run_at_boundary().
//    An exception that escapes the body is caught there, its message copied
//    into palloc'd memory inside the catch, and reported with ereport() only
//    after the catch block has ended (53200 for std::bad_alloc, XX000
//    otherwise), so no C++ exception ever reaches a PostgreSQL frame.
//
//  * PostgreSQL -> C++: code that calls PostgreSQL (and so may be longjmp'd
//    out of) holds only trivially destructible values: plain structs, palloc'd
//    memory, PostgreSQL's own lists. A longjmp through such frames skips no
//    destructor, and PostgreSQL's own errors - say P0001 raised by the
//    caller's fn - travel up unchanged, SQLSTATE and all. C++ types with
//    destructors (std::string, containers) live only in units that include no
//    PostgreSQL header. The compiler checks both: each struct such frames
//    hold is followed by static_assert(std::is_trivially_destructible_v<..>),
//    and the server-free units include idempotency/server_free.hpp, which fails
//    the build when a PostgreSQL header comes with them.
#pragma once

#include <exception>
#include <new>

#include "idempotency/pg.hpp"

namespace idempotency {

namespace detail {
struct CaughtError {
  int sqlstate;
  const char *message;
};
static_assert(std::is_trivially_destructible_v<CaughtError>);

// Copies what an exception says into palloc'd memory. Called inside a catch
// block; allocates only with palloc and never throws.
inline CaughtError describe_current_exception() noexcept {
  try {
    throw;
  } catch (const std::bad_alloc &) {
    return {ERRCODE_OUT_OF_MEMORY, "out of memory in C++ code"};
  } catch (const std::exception &e) {
    return {ERRCODE_INTERNAL_ERROR, psprintf("C++ exception: %s", e.what())};
  } catch (...) {
    return {ERRCODE_INTERNAL_ERROR, "unknown C++ exception"};
  }
}

[[noreturn]] inline void report(const CaughtError &error) {
  ereport(ERROR, (errcode(error.sqlstate), errmsg("%s", error.message)));
  pg_unreachable();
}
} // namespace detail

template <typename Body>
Datum run_at_boundary(Body &&body, FunctionCallInfo fcinfo) {
  detail::CaughtError error;
  try {
    return body(fcinfo);
  } catch (...) {
    error = detail::describe_current_exception();
  }
  detail::report(error);
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
