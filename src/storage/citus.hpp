// Citus: the distributed PostgreSQL extension, when it runs in this backend.
//
// On a Citus coordinator, idempotency.keys is an ordinary local table while
// fn (or the handler's own statements) may change distributed tables on the
// workers. That matters at commit:
//
// - Commit. Citus commits the workers' part of a transaction itself, from
//   its own callback at XACT_EVENT_PRE_COMMIT. It uses two-phase commit only
//   when it knows the transaction wrote on more than one node, and it does
//   not see writes to local tables that are not its own (the key row is
//   written through the executor, outside Citus's planner). A transaction
//   that changed one shard would then commit that shard with a plain COMMIT
//   before the coordinator commits the key: a crash in between keeps the
//   work and loses the key, and the retry runs the request again.
//   note_key_write() asks Citus for two-phase commit whenever a transaction
//   that wrote idempotency.keys is a Citus coordinated transaction at its
//   end. The workers then PREPARE before the coordinator commits, and the
//   coordinator's local commit - which holds the key row and Citus's own
//   record of the prepared transactions (pg_dist_transaction) - decides for
//   all: Citus's recovery commits the prepared work when that record
//   committed and rolls it back otherwise.
//
// Citus is never linked against: its functions are looked up in the library
// the server loaded at start (Citus can only be loaded through
// shared_preload_libraries), so without Citus nothing here does anything.
#pragma once

#include "pg.hpp"

namespace idempotency::storage::citus {

// Records that the current transaction wrote idempotency.keys (a key row
// stored or deleted). When Citus is loaded, the transaction will commit
// through two-phase commit if it is a Citus coordinated transaction now or
// becomes one before it commits; otherwise this does nothing.
void note_key_write();

} // namespace idempotency::storage::citus
