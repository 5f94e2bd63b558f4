// The prelude of every unit that uses PostgreSQL: postgres.h first, as the
// server requires, and fmgr.h. Standard C++ headers and server-free headers
// must come before it: PostgreSQL's macros (Min, Max, printf, ...) break
// them.
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
