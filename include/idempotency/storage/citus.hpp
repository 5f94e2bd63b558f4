// Citus: the distributed PostgreSQL extension, when it runs in this backend.
//
// On a Citus coordinator, idempotency.keys is an ordinary local table while
// fn (or the handler's own statements) may change distributed tables on the
// workers. Two things follow:
//
// - Commit. Citus commits the workers' part of a transaction itself, from
//   its own callback at XACT_EVENT_PRE_COMMIT. It uses two-phase commit only
//   when it knows the transaction wrote on more than one node, and it does
//   not see writes to local tables that are not its own (idempotency.keys
//   is a plain local table to Citus). A transaction
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
// Citus is never linked against. Everything but the commit goes through
// Citus's SQL API. The commit needs the only two C functions still called,
// looked up in the library the server loaded at start (Citus can only be
// loaded through shared_preload_libraries): InCoordinatedTransaction and
// Use2PCForCoordinatedTransaction, since no SQL function asks Citus for
// two-phase commit of a transaction whose local write it did not make.
// Checked on Citus 13.2.2 (built for PostgreSQL 15, which exports them)
// and in 14.0.1's source (built for 16 to 18 only, which export none:
// then refused, see note_key_write). Without Citus nothing here does
// anything.
#pragma once

#include "idempotency/pg.hpp"

namespace idempotency::storage::citus {

// Records that the current transaction wrote a key row in idempotency.keys,
// which Citus's executor does not write. When Citus is loaded, the transaction
// will commit through two-phase commit if it is a Citus coordinated
// transaction now or becomes one before it commits; otherwise this does
// nothing. Where Citus's library does not export the functions that ask for
// two-phase commit (Citus built for PostgreSQL 16 or later), a coordinated
// transaction this backend started is refused instead (0A000), now or
// before it commits.
void note_key_write();

// Called by entry/transaction.cpp, the extension's transaction callbacks:
// at PRE_COMMIT, the decision above is made again (0A000 where it cannot be
// asked for).
void at_pre_commit();
void at_transaction_end();

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

// --- a shard of a hash-distributed table on this node ------------------------
//
// Tenant keys are written through Citus (its router and executor), and read
// in the tenant's shard relation on this node under the lock Citus's own
// writes take. These read Citus's metadata and take that lock through its
// SQL API, each statement prepared once per backend and read with a
// snapshot taken at the statement, as Citus reads its catalogs. Each needs
// a transaction; none needs any right on the distributed table but those
// that take `owner`.

// Raises 0A000, with the tested versions in its hint, unless the loaded
// Citus is a major version tenant keys were tested with
// (storage/citus_version.hpp), and 55000 when Citus is not loaded.
void require_tested_citus();

// The shard of `relid` (hash-distributed) that holds the distribution value
// `value` of type `type` (the distribution column's type), by
// get_shard_id_for_distribution_column(), as `owner` (Citus checks that its
// caller may read the table), and its relation on this node (InvalidOid:
// none).
struct ShardOfValue {
  uint64 shard;
  Oid local_relation;
};
ShardOfValue shard_for_value(Oid relid, Oid owner, Oid type, Datum value);

// Citus's lock on the placement metadata of `shard`, in share mode, until
// the transaction ends, by lock_shard_metadata() as `owner` (the table's
// owner, which it requires): what Citus's executor takes before it writes a
// shard, and what a shard move takes in exclusive mode, on every node, for
// its final switch-over (after it has copied the shard and while its
// logical replication catches up with what was written to the old
// placement). For a hash-distributed table it locks the shard's group of
// co-located shards. Invalidations that arrived meanwhile are taken in.
void lock_shard_placement(uint64 shard, Oid owner);

// The relation of `shard` of `relid` on this node (InvalidOid: none; Citus's
// shard_name()), and whether Citus's metadata places the shard here: a move
// that committed before the lock was granted is seen.
struct ShardHere {
  Oid local_relation;
  bool placed_here;
};
ShardHere shard_here_now(Oid relid, uint64 shard);

// --- Citus's metadata --------------------------------------------------------
//
// Read through SQL (pg_dist_partition, pg_dist_shard, pg_dist_local_group),
// which every role may read; none needs the Citus library loaded.

// This node's group (0: the coordinator), from pg_dist_local_group; an
// error where the database has no such catalog.
int32 local_group();

// The relations on this node of the shards of `relid`, from pg_dist_shard:
// those placed here, and those of a shard Citus is moving here or moved
// away and has not dropped yet, whose rows are on this node too. palloc'd
// in the current memory context.
struct ShardRelations {
  int count;
  Oid *relids;
};
static_assert(std::is_trivially_destructible_v<ShardRelations>);
ShardRelations local_shard_relations(Oid relid);

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
[[noreturn]] void report_citus_table(TableKind kind);

// The message of report_citus_table, for the expiry worker's log and status.
const char *citus_table_message(TableKind kind);

} // namespace idempotency::storage::citus
