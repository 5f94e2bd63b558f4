#include "idempotency/storage/citus_version.hpp"

#include "idempotency/server_free.hpp" // must be the last include

namespace idempotency::storage::citus {

namespace {
constexpr int tested_majors[] = {13, 14};
constexpr int max_major = 9999;
} // namespace

CitusVersionCheck check_citus_version(const char *version, int *major) {
  if (major != nullptr)
    *major = 0;
  if (version == nullptr)
    return CitusVersionCheck::malformed;
  int value = 0;
  const char *p = version;
  for (; *p >= '0' && *p <= '9'; ++p) {
    value = value * 10 + (*p - '0');
    if (value > max_major)
      return CitusVersionCheck::malformed;
  }
  if (p == version || *p != '.')
    return CitusVersionCheck::malformed;
  if (major != nullptr)
    *major = value;
  for (int tested : tested_majors)
    if (value == tested)
      return CitusVersionCheck::tested;
  return CitusVersionCheck::untested;
}

} // namespace idempotency::storage::citus
