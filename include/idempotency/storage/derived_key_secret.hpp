// The database's derived-key secret: the key of the MAC behind
// idempotency.derived_key (fingerprint/derived_key.hpp).
//
// Unlike the cluster's claim secret (storage/claim_secret.hpp), which may
// change at every restart, a derived key must be the same on every retry of
// a request, whatever happened in between: so its secret lives in a table,
// idempotency.derived_key_secret, one row that the install or update script
// fills with 32 random bytes, and that WAL, physical replication,
// pg_upgrade and pg_dump (a configuration table of the extension) carry
// like any data. Only its owner has rights on the table: the library reads
// it with a heap scan, which checks no privileges, in the caller's snapshot
// - a rotation (UPDATE by a superuser) is seen as soon as it commits, and a
// call never sees half of it. It is read on every call, not kept: the scan
// of a one-page table costs less than the call, and nothing can go stale.
#pragma once

#include "idempotency/pg.hpp"

namespace idempotency::storage {

constexpr std::size_t derived_key_secret_bytes = 32;

struct DerivedKeySecret {
  uint8 bytes[derived_key_secret_bytes];
};
static_assert(std::is_trivially_destructible_v<DerivedKeySecret>);

// The secret of this database. 55000 when the table does not exist, holds
// no row, more than one, or a secret of another size: never a key derived
// from no secret. The caller wipes it after use.
DerivedKeySecret read_derived_key_secret();

} // namespace idempotency::storage
