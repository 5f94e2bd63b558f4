#include "idempotency/boundary/boundary.hpp"

namespace idempotency::detail {

CaughtError describe_current_exception() noexcept {
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

void report(const CaughtError &error) {
  ereport(ERROR, (errcode(error.sqlstate), errmsg("%s", error.message)));
  pg_unreachable();
}

} // namespace idempotency::detail
