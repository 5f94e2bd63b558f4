// The two secrets the library keys its MACs with (docs/security.md): the
// cluster's claim secret, in a file of the data directory, and each
// database's derived-key secret, in a table.
//
// Claim lock tags must be the same in every backend of the cluster and
// unpredictable to every role, so the claim secret lives in the data
// directory (mode 0600 or the cluster's group mode): not in shared memory,
// since idempotent_call works without shared_preload_libraries, nor in a
// table or setting, which SQL would reach. The first backend to need it
// writes 32 bytes from pg_strong_random() to a file of its own, syncs it and
// link()s it to the final name: link() never replaces an existing name, so
// of backends racing the first wins and no reader sees a partly written
// file. Claims live only as long as the server runs: a new secret after a
// restart changes nothing. Removing the file while the server runs splits
// backends between two secrets; even then the primary key of
// idempotency.keys keeps a key from committing twice.
#pragma once

#include "idempotency/pg.hpp"

namespace idempotency::storage {

constexpr std::size_t claim_secret_bytes = 32;

struct ClaimSecret {
  uint8 bytes[claim_secret_bytes];
};
static_assert(std::is_trivially_destructible_v<ClaimSecret>);

// The cluster's claim secret, read from its file in the data directory, which
// is made first if it does not exist yet. Raises an error if the file cannot
// be read or written. The caller keys its MAC with it (protocol/call)
// once per backend, then wipes it.
ClaimSecret read_claim_secret();

// The database's derived-key secret, the key of the MAC behind
// idempotency.derived_key (fingerprint/key_digest.hpp), must be the same on
// every retry of a request, whatever happened in between: so it is the one
// row of idempotency.derived_key_secret, filled by the install or update
// script and carried like any data by WAL, replication, pg_upgrade and
// pg_dump. Only its owner has rights on the table: the library reads it
// with a table scan, which checks none, on every call (a one-page table
// costs less than the call, and nothing can go stale), in the statement's
// snapshot, so a rotation is seen as soon as it commits and never by half.

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
