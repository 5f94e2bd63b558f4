// idempotency.store_errors, parsed without the server. No PostgreSQL header.
#pragma once

#include <cstddef>

#include "idempotency/server_free.hpp" // must be the last include

namespace idempotency {

// SQLSTATEs ("P0001") and classes ("23") of fn errors stored as the outcome.
struct SqlstateList {
  static constexpr int capacity = 64;
  int count;
  char entries[capacity][6]; // upper case, NUL-terminated: 5 or 2 characters
};

enum class SqlstateListCheck {
  ok,
  malformed,    // not 5 or 2 characters of [0-9A-Za-z], or an empty entry
  too_many,     // more than SqlstateList::capacity entries
  not_an_error, // class 00, 01 or 02: success, warning, no data
  transient,    // a class whose errors a retry may not meet again
};

struct SqlstateListResult {
  SqlstateListCheck check;
  std::size_t entry_start; // where the offending entry starts in the text
  std::size_t entry_size;
};

// Parses a comma-separated list; blanks around entries are ignored and the
// empty text is the empty list. Storing a transient condition would make a
// passing condition the request's permanent answer: sqlstate_transient()'s
// are refused, and IK (the extension's own IK409, ...), never fn's outcome.
SqlstateListResult parse_sqlstate_list(const char *text,
                                       SqlstateList &out) noexcept;

// Whether a five-character SQLSTATE is a transient condition (listed in
// src/settings/sqlstate_list.cpp), never stored whatever is listed.
bool sqlstate_transient(const char *sqlstate) noexcept;

// Whether a five-character SQLSTATE is listed, itself or by its class.
bool sqlstate_listed(const SqlstateList &list, const char *sqlstate) noexcept;

} // namespace idempotency
