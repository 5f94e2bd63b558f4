// Server-free check of server_version_num. No PostgreSQL header.
#include "idempotency/entry/server_version.hpp"

#include "idempotency/server_free.hpp" // must be the last include

namespace idempotency::entry {

namespace {
constexpr int digits = 6; // majors 10 to 99: MMmmmm
} // namespace

ServerVersionCheck check_server_version(const char *server_version_num,
                                        int minimum, int *running) {
  if (running != nullptr)
    *running = 0;
  if (server_version_num == nullptr)
    return ServerVersionCheck::malformed;
  int value = 0;
  int length = 0;
  for (const char *p = server_version_num; *p != '\0'; ++p, ++length) {
    if (*p < '0' || *p > '9' || length == digits)
      return ServerVersionCheck::malformed;
    value = value * 10 + (*p - '0');
  }
  if (length != digits || server_version_num[0] == '0')
    return ServerVersionCheck::malformed;
  if (running != nullptr)
    *running = value;
  if (value / 10000 != minimum / 10000)
    return ServerVersionCheck::other_major;
  return value < minimum ? ServerVersionCheck::too_old
                         : ServerVersionCheck::supported;
}

} // namespace idempotency::entry
