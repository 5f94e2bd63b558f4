// Citus: the distributed PostgreSQL extension, when it runs in this backend.
//
// On a Citus coordinator, idempotency.keys is an ordinary local table while
// fn (or the handler's own statements) may change distributed tables on the
// workers. Two things follow:
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
// - Where the keys live. A table Citus has taken over (distributed,
//   reference, or a local table added to its metadata) keeps its rows in
//   shards, not in the local heap this extension reads and writes: keys
//   would be split between the two. table_kind() tells; storage/keys.cpp
//   refuses such a table (report_citus_table).
//
// Citus is never linked against: its functions are looked up in the library
// the server loaded at start (Citus can only be loaded through
// shared_preload_libraries), so without Citus nothing here does anything.
#pragma once

#include "idempotency/pg.hpp"

namespace idempotency::storage::citus {

// Records that the current transaction wrote idempotency.keys (a key row
// stored or deleted). When Citus is loaded, the transaction will commit
// through two-phase commit if it is a Citus coordinated transaction now or
// becomes one before it commits; otherwise this does nothing.
void note_key_write();

// idempotent_call runs fn between these two. Citus opens transactions on
// the workers for the distributed statements of a function only while
// citus.function_opens_transaction_block is on (its default; off is kept
// for compatibility with Citus before 8.2): off, outside a transaction
// block, each such statement commits on its worker at once, before the key
// is even written, and nothing ties the two together. While fn runs the
// setting is on. begin_fn returns what end_fn needs (0: nothing changed).
// An error in fn ends the (sub)transaction, which restores the setting.
int begin_fn();
void end_fn(int guc_level);

// What Citus's metadata (pg_dist_partition) says about a table.
enum class TableKind {
  not_citus,     // not in Citus's metadata, or Citus is not installed
  distributed,   // hash-, range- or append-distributed, or single-shard
  reference,     // a reference table: a copy on every node
  managed_local, // a local table added to Citus's metadata (a shard of its own)
};

// Reads pg_catalog.pg_dist_partition, if the database has one. Does not
// depend on the Citus library being loaded: the metadata decides where the
// rows are. Needs a transaction.
TableKind table_kind(Oid relid);

// 0A000: idempotency.keys is a Citus table of this kind.
pg_attribute_noreturn() void report_citus_table(TableKind kind);

// The message of report_citus_table, for the expiry worker's log and status.
const char *citus_table_message(TableKind kind);

} // namespace idempotency::storage::citus
