// Whether the running server's minor release is one the library runs in,
// decided from the text of server_version_num without the server (_PG_init
// asks, with the minimum from idempotency/compat.hpp). No PostgreSQL header
// here.
#pragma once

#include "idempotency/server_free.hpp" // must be the last include

namespace idempotency::entry {

enum class ServerVersionCheck {
  supported,   // the minimum's major, at or after the minimum
  too_old,     // the minimum's major, an older minor release
  other_major, // another major (its magic block refuses it first)
  malformed,   // not a server_version_num: not 6 digits
};

// Checks server_version_num's text ("150020": 15.20) against the minimum
// (a number, 150010: 15.10). *running gets the running server's number
// when there is one (0 otherwise), and may be null.
ServerVersionCheck check_server_version(const char *server_version_num,
                                        int minimum, int *running);

} // namespace idempotency::entry
