// Which Citus versions the Citus integration was tested with, decided from
// the text of citus.version without the server. No PostgreSQL header here.
#pragma once

#include "idempotency/server_free.hpp" // must be the last include

namespace idempotency::storage::citus {

// The tested versions, for messages and hints.
constexpr const char *tested_citus_versions = "13.2 or 14.0";

enum class CitusVersionCheck {
  tested,    // a major version the integration was tested with (13, 14)
  untested,  // another major version
  malformed, // not a version: no leading "<major>."
};

// Reads the major version from a citus.version value ("13.2.2", "14.0.1",
// "14.1devel"); a null pointer is malformed. *major gets the major version
// when there is one (0 otherwise), and may be null.
CitusVersionCheck check_citus_version(const char *version, int *major);

} // namespace idempotency::storage::citus
