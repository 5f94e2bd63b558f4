// Server-free parsing of idempotency.store_errors. No PostgreSQL header.
#include "idempotency/settings/sqlstate_list.hpp"

#include <cstring>

#include "idempotency/server_free.hpp" // must be the last include

namespace idempotency {

namespace {

constexpr const char *blanks = " \t\n\r";
constexpr const char *sqlstate_chars =
    "0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz";

char upper(char c) noexcept { return c >= 'a' && c <= 'z' ? c - 'a' + 'A' : c; }

bool starts_with(const char *text, const char *prefix) noexcept {
  return std::strncmp(text, prefix, std::strlen(prefix)) == 0;
}

// Whether `text` starts with one of the classes or SQLSTATEs listed.
template <std::size_t N>
bool in(const char *text, const char *const (&listed)[N]) noexcept {
  for (const char *prefix : listed)
    if (starts_with(text, prefix))
      return true;
  return false;
}

constexpr const char *not_error_classes[] = {"00", "01", "02"};
// Transient: classes 08 (connection), 40 (rollback: serialization failures,
// deadlocks), 53 (resources), 57 (cancels, timeouts, shutdown), 58 (system),
// 72 (snapshot too old), XX (internal); and in classes that may be listed,
// transaction and lock timeouts, an object in use, a foreign server down.
constexpr const char *transient_classes[] = {"08", "40", "53", "57",
                                             "58", "72", "XX"};
constexpr const char *transient_sqlstates[] = {"25P03", "25P04", "55P03",
                                               "55006", "HV00N"};

} // namespace

SqlstateListResult parse_sqlstate_list(const char *text,
                                       SqlstateList &out) noexcept {
  out.count = 0;
  std::size_t length = std::strlen(text);
  if (std::strspn(text, blanks) == length)
    return {SqlstateListCheck::ok, 0, 0};

  for (std::size_t start = 0; start <= length;) {
    std::size_t end = start + std::strcspn(text + start, ",");
    std::size_t first = start + std::strspn(text + start, blanks), last = end;
    while (last > first && std::strchr(blanks, text[last - 1]) != nullptr)
      last--;
    std::size_t size = last - first;
    if ((size != 5 && size != 2) ||
        std::strspn(text + first, sqlstate_chars) < size)
      return {SqlstateListCheck::malformed, first, size};
    if (out.count == SqlstateList::capacity)
      return {SqlstateListCheck::too_many, first, size};
    char *entry = out.entries[out.count];
    for (std::size_t i = 0; i < size; i++)
      entry[i] = upper(text[first + i]);
    entry[size] = '\0';
    if (in(entry, not_error_classes))
      return {SqlstateListCheck::not_an_error, first, size};
    if (in(entry, transient_classes) || in(entry, transient_sqlstates) ||
        starts_with(entry, "IK"))
      return {SqlstateListCheck::transient, first, size};
    out.count++;
    start = end + 1;
  }
  return {SqlstateListCheck::ok, 0, 0};
}

bool sqlstate_listed(const SqlstateList &list, const char *sqlstate) noexcept {
  for (int i = 0; i < list.count; i++)
    if (starts_with(sqlstate, list.entries[i]))
      return true;
  return false;
}

bool sqlstate_transient(const char *sqlstate) noexcept {
  return std::strlen(sqlstate) == 5 &&
         (in(sqlstate, transient_classes) || in(sqlstate, transient_sqlstates));
}

} // namespace idempotency
