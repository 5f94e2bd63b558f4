// The prelude of every unit that uses PostgreSQL: postgres.h first, as the
// server requires, and fmgr.h, which every SQL-callable function and most
// interfaces use. Each file includes the other server headers it uses
// itself, in an extern "C" block after its project includes.
//
// Standard C++ headers, and the server-free headers that use them, must come
// before this file: PostgreSQL defines macros (Min, Max, printf, snprintf,
// strerror, ...) that break them. idempotency/server_free.hpp enforces the
// latter.
#pragma once

#include <cstddef>
#include <cstdint>
#include <type_traits>

extern "C" {
#include "postgres.h"

#include "fmgr.h"
// The varlena macros, which PostgreSQL 16 moved out of postgres.h.
#if __has_include("varatt.h")
#include "varatt.h"
#endif
}
