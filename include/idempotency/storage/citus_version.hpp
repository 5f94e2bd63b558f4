// Tested Citus versions, judged from citus.version's text without the server.
#pragma once

#include "idempotency/server_free.hpp" // must be the last include

namespace idempotency::storage::citus {

constexpr const char *tested_citus_versions = "13.2 or 14.0";

enum class CitusVersionCheck {
  tested,    // a major version the integration was tested with (13, 14)
  untested,  // another major version
  malformed, // not a version: no leading "<major>."
};

// From a citus.version value ("13.2.2", "14.1devel"; null is malformed).
// *major (may be null) gets the major version, 0 when there is none.
CitusVersionCheck check_citus_version(const char *version, int *major);

} // namespace idempotency::storage::citus
