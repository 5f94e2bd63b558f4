// The two secrets the library keys its MACs with: the cluster's claim
// secret, in a file of the data directory, and each database's derived-key
// secret, in a table.
//
// The cluster's claim secret: the key of the MAC in claim lock tags.
//
// Claim tags must be the same in every backend of the cluster (two callers
// of one key must meet on one lock) and unpredictable to every role (so no
// role can aim a tag at another role's key or recognise a key it guesses in
// pg_locks). The secret therefore lives in a file in the data directory,
// made on first use and read once per backend:
//
// - not shared memory: idempotent_call works without the library in
//   shared_preload_libraries, where there is none to keep it in;
// - not a table or a setting: SQL would reach it;
// - the file is mode 0600 (or the cluster's group mode) like the rest of the
//   data directory; only superusers and members of pg_read_server_files can
//   read files there from SQL.
//
// The first backend to need it writes 32 bytes from pg_strong_random() to a
// file of its own, syncs it, and link()s it to the final name: link() never
// replaces an existing name, so of several backends racing the first one
// wins, the others read the winner's secret, and no reader ever sees a
// partly written file. Claims live only as long as the server runs, so the
// secret needs no durability beyond that: a new one after a restart (the
// file lost in an OS crash, a restore without it) changes nothing. Removing
// the file while the server runs would split backends that read the old
// secret from those that make a new one; even then the primary key of
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

// The database's derived-key secret: the key of the MAC behind
// idempotency.derived_key (fingerprint/key_digest.hpp).
//
// Unlike the cluster's claim secret (above), which may change at every
// restart, a derived key must be the same on every retry of a request,
// whatever happened in between: so its secret lives in a table,
// idempotency.derived_key_secret, one row that the install or update script
// fills with 32 random bytes, and that WAL, physical replication,
// pg_upgrade and pg_dump (a configuration table of the extension) carry
// like any data. Only its owner has rights on the table: the library reads
// it with a heap scan, which checks no privileges, in the caller's snapshot
// - a rotation (UPDATE by a superuser) is seen as soon as it commits, and a
// call never sees half of it. It is read on every call, not kept: the scan
// of a one-page table costs less than the call, and nothing can go stale.

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
