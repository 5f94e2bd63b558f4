// The value of idempotency.store_errors, parsed without the server: a list
// of SQLSTATEs and classes. No PostgreSQL header here.
#pragma once

#include <cstddef>

#include "idempotency/server_free.hpp" // must be the last include

namespace idempotency {

// idempotency.store_errors: SQLSTATEs ("P0001") and two-character classes
// ("23") whose errors raised by fn are stored as the call's outcome.
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
// empty text is the empty list. Transient conditions are refused, because
// storing them would make a passing condition the request's permanent
// answer: the classes and SQLSTATEs of sqlstate_transient() below, and IK
// (the extension's own IK409, IK422, ...).
SqlstateListResult parse_sqlstate_list(const char *text,
                                       SqlstateList &out) noexcept;

// Whether a five-character SQLSTATE is a transient condition, one a retry
// may not meet again, and so is never stored whatever is listed: classes 08
// (connection), 40 (transaction rollback: serialization failures, deadlocks,
// 40003), 53 (insufficient resources: out of memory, disk full, too many
// connections), 57 (operator intervention: cancels, statement_timeout,
// shutdown, idle_session_timeout), 58 (system error), 72 (snapshot too old)
// and XX (internal); and in classes that may be listed: 25P03 and 25P04
// (idle-in-transaction and transaction timeouts), 55P03 (lock_timeout,
// NOWAIT), 55006 (object in use by another session) and HV00N (a foreign
// server unreachable).
bool sqlstate_transient(const char *sqlstate) noexcept;

// Whether a five-character SQLSTATE is listed, itself or by its class.
bool sqlstate_listed(const SqlstateList &list, const char *sqlstate) noexcept;

} // namespace idempotency
