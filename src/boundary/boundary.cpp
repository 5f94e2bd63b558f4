#include "boundary/boundary.hpp"

namespace idempotency::detail {

namespace {
int sqlstate_code(const char *s) {
  return MAKE_SQLSTATE(s[0], s[1], s[2], s[3], s[4]);
}
} // namespace

CaughtError describe_current_exception() noexcept {
  try {
    throw;
  } catch (const SqlError &e) {
    return {sqlstate_code(e.sqlstate()), pstrdup(e.what())};
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
