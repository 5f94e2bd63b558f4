// Rules of the call that need no server: key size limits and how the shape
// of fn's result maps to a jsonb response. No PostgreSQL header here.
#pragma once

#include <cstddef>
#include <cstdint>

namespace idempotency {

constexpr std::size_t max_key_bytes = 255;

enum class KeyCheck { ok, empty, too_long };

// Checks a key by its size in bytes alone, so an oversized key is refused
// before its value is read or reaches an index.
KeyCheck check_key_size(std::size_t bytes) noexcept;

// How fn's result becomes the response (see README, "Result to jsonb"):
//   no_response  - fn returned no rows, or was not a row-returning statement
//                  (SQL NULL);
//   value        - one row of one column: that value as jsonb;
//   object       - one row of several columns: {"column": value, ...};
//   array        - several rows: a jsonb array with one element per row,
//                  each element a value or an object as above.
enum class ResultShape { no_response, value, object, array };

ResultShape result_shape(std::uint64_t rows, int columns) noexcept;

// Whether each row is represented as a bare value (one column) or an object.
inline bool row_is_object(int columns) noexcept { return columns > 1; }

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
// empty text is the empty list. Refused as transient, because storing them
// would make a passing condition the request's permanent answer: classes
// 08 (connection), 40 (transaction rollback: serialization failures,
// deadlocks), 53 (insufficient resources), 57 (operator intervention:
// cancels, statement_timeout, shutdown), 58 (system error), XX (internal)
// and IK (the extension's own IK409, IK422, ...).
SqlstateListResult parse_sqlstate_list(const char *text,
                                       SqlstateList &out) noexcept;

// Whether a five-character SQLSTATE is listed, itself or by its class.
bool sqlstate_listed(const SqlstateList &list, const char *sqlstate) noexcept;

} // namespace idempotency
