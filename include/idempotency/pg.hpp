// The prelude of every unit that uses PostgreSQL: postgres.h first, as the
// server requires, then fmgr.h. Standard C++ and server-free headers come
// before it: PostgreSQL's macros (Min, Max, printf, ...) break them.
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
