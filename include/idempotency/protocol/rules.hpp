// Rules of the call that need no server: key size limits and how the shape
// of fn's result maps to a jsonb response. No PostgreSQL header here.
#pragma once

#include <cstddef>
#include <cstdint>

#include "idempotency/server_free.hpp" // must be the last include

namespace idempotency {

// Counted in the key's UTF-8 form, whatever the database encoding.
constexpr std::size_t max_key_bytes = 255;

enum class KeyCheck { ok, empty, too_long };

// By size alone: an oversized key is refused before it reaches an index.
inline KeyCheck check_key_size(std::size_t bytes) noexcept {
  if (bytes == 0)
    return KeyCheck::empty;
  return bytes > max_key_bytes ? KeyCheck::too_long : KeyCheck::ok;
}

// See docs/how-it-works.md, "Result to jsonb".
enum class ResultShape { no_response, value, object, array };

inline bool row_is_object(int columns) noexcept { return columns > 1; }

inline ResultShape result_shape(std::uint64_t rows, int columns) noexcept {
  // No tuple descriptor (columns <= 0): no response, whatever the row count.
  if (rows == 0 || columns <= 0)
    return ResultShape::no_response;
  if (rows > 1)
    return ResultShape::array;
  return row_is_object(columns) ? ResultShape::object : ResultShape::value;
}

} // namespace idempotency
