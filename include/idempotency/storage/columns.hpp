// Columns of the tables the extension reads and writes, found by name: a
// DBA may add, drop and reorder others.
#pragma once

#include "idempotency/pg.hpp"

extern "C" {
#include "access/tupdesc.h"
}

namespace idempotency::storage {

// The live column `name` of `desc`, nullptr when there is none.
Form_pg_attribute find_column(TupleDesc desc, const char *name);

// Whether a column of `type` can hold a key's scope, a role's oid: regrole,
// or the extension's own 4-byte by-value type for it.
bool fits_scope(Oid type);

} // namespace idempotency::storage
