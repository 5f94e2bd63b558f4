// The per-backend caches of the protocol layer (statements, inferred
// parameter types) are hash tables of the same kind: entries keyed by a
// 64-bit hash of what they describe, kept in a memory context of the cache's
// own for the life of the backend. A caller checks an entry's full key
// itself: two keys may share a hash.
#pragma once

#include "idempotency/pg.hpp"

extern "C" {
#include "utils/hsearch.h"
}

namespace idempotency::protocol {

// A hash table `name` of entries of `entry_size` bytes whose first member is
// their uint64 key, allocated in `context` (the cache's own, under
// TopMemoryContext, so that it outlives every transaction).
HTAB *create_backend_table(const char *name, Size entry_size,
                           MemoryContext context);

// The key both caches give a statement: a hash of fn's text (`sql_size`
// bytes) and the caller's argument types, cut to
// idempotency.debug_statement_hash_bits.
uint64 statement_hash(const char *sql, size_t sql_size, int nargs,
                      const Oid *types);

} // namespace idempotency::protocol
