// What the expiry worker did, per database, in shared memory.
//
// Shared memory rather than a table: the worker records a round without
// writing WAL or leaving dead rows behind, the record is readable from every
// database (and while a database's own table is locked), and it needs the
// library preloaded, which the worker needs anyway. It starts empty after a
// restart of the server.
#pragma once

#include "idempotency/pg.hpp"

extern "C" {
#include "datatype/timestamp.h"
}

namespace idempotency::worker::status {

// shmem_request_hook and shmem_startup_hook duties, while preloading.
void request_shared_memory();
void attach_shared_memory();

// A worker began a round in `database`.
void round_started(Oid database, TimestampTz at);

// The round in `database` ended; error is NULL when it succeeded.
void round_finished(Oid database, TimestampTz at, int64 deleted,
                    const char *error);

// Ends the round in `database` as failed with `error`, if its worker left
// without saying how it went (it was terminated, or crashed).
void round_abandoned(Oid database, TimestampTz at, const char *error);

// The extension is not (or no longer) installed in `database`.
void forget(Oid database);

// Keeps only the databases listed (the others were dropped).
void forget_all_but(const Oid *databases, int count);

// Body of idempotency.expiry_status(): one row per remembered database.
Datum expiry_status_body(FunctionCallInfo fcinfo);

} // namespace idempotency::worker::status
