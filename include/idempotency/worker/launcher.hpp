// The expiry background worker: the launcher (launcher.cpp) and the
// per-database rounds it starts (database_round.cpp).
#pragma once

#include "idempotency/pg.hpp"

extern "C" {
#include "postmaster/bgworker.h"
}

namespace idempotency::worker {

// --- the launcher: one round per database ------------------------------------

// Registers the launcher; called from _PG_init while
// shared_preload_libraries is being processed (the shared memory the
// workers report to is requested there too, by entry/module.cpp).
void register_launcher();

// --- a round: one database ---------------------------------------------------
//
// One expiry round in one database, run by a short-lived background worker
// that the launcher starts for that database.

// The per-database worker's name in pg_stat_activity.backend_type.
constexpr const char *database_worker_type = "idempotency expiry";

// Fills in a dynamic background worker that runs one round in `database`
// and reports its end to the process `notify_pid`.
void describe_database_worker(BackgroundWorker *worker, Oid database,
                              pid_t notify_pid);

// Whether a command that must be alone in `database` (DROP DATABASE,
// CREATE DATABASE ... TEMPLATE, ALTER DATABASE ... RENAME or SET TABLESPACE)
// is waiting for it: they hold a lock on the database that conflicts with
// the one every new connection takes. Works outside transactions.
bool database_wanted_alone(Oid database);

} // namespace idempotency::worker
