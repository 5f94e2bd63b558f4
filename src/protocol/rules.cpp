// Server-free rules of the call. No PostgreSQL header.
#include "idempotency/protocol/rules.hpp"

#include "idempotency/server_free.hpp" // must be the last include

namespace idempotency {

KeyCheck check_key_size(std::size_t bytes) noexcept {
  if (bytes == 0)
    return KeyCheck::empty;
  if (bytes > max_key_bytes)
    return KeyCheck::too_long;
  return KeyCheck::ok;
}

ResultShape result_shape(std::uint64_t rows, int columns) noexcept {
  // A statement that returns no tuple descriptor (columns <= 0) has nothing
  // to turn into a response, whatever its row count says.
  if (rows == 0 || columns <= 0)
    return ResultShape::no_response;
  if (rows > 1)
    return ResultShape::array;
  return row_is_object(columns) ? ResultShape::object : ResultShape::value;
}

} // namespace idempotency
