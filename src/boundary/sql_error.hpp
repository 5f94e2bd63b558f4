// An error that C++ code raises and PostgreSQL reports with a given SQLSTATE.
// No PostgreSQL header: pure C++ units throw it, the boundary reports it.
#pragma once

#include <stdexcept>
#include <string>

namespace idempotency {

class SqlError : public std::runtime_error {
public:
  // sqlstate: the five-character code, e.g. "22023".
  SqlError(const char (&sqlstate)[6], const std::string &message)
      : std::runtime_error(message), sqlstate_{sqlstate[0], sqlstate[1],
                                               sqlstate[2], sqlstate[3],
                                               sqlstate[4], '\0'} {}

  const char *sqlstate() const noexcept { return sqlstate_; }

private:
  char sqlstate_[6];
};

} // namespace idempotency
