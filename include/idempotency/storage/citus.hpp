// Citus in this backend (docs/scale-out.md). Citus commits the workers' part at
// PRE_COMMIT with two-phase commit only for writes it knows of, which a write
// to idempotency.keys is not: note_key_write() asks for it, through two C
// functions of the loaded library (no SQL function does), which Citus built for
// PostgreSQL 15 exports (13.2.2) and built for 16 to 18 does not (14.0.1's
// source). All else uses Citus's SQL API; Citus is never linked against.
#pragma once

#include "idempotency/pg.hpp"

extern "C" {
#include "nodes/pg_list.h"
}

namespace idempotency::storage::citus {

// Makes a transaction that wrote idempotency.keys commit through two-phase
// commit if it is or becomes a Citus coordinated transaction; where that
// cannot be asked for, one this backend started is refused (0A000).
void note_key_write();

// At PRE_COMMIT the decision above is made again.
void at_pre_commit();
void at_transaction_end();

// Around fn, citus.function_opens_transaction_block is on: off, outside a
// transaction block, each distributed statement of a function commits on its
// worker at once. An error in fn ends the (sub)transaction, which restores it.
int begin_fn();
void end_fn(int guc_level);

// --- a shard of a hash-distributed table on this node ------------------------

// 55000 if Citus is not loaded; 0A000 if its major version is untested.
void require_tested_citus();

// Finds the shard of `relid` for distribution value `value` (of type `type`);
// as `owner` (the table's owner, as Citus requires), takes Citus's share lock
// on its placement metadata until the transaction ends, as its executor does
// before writing a shard; then reads, as of now, where the shard is.
struct ShardPlacement {
  // The shard's relation on this node before the lock (InvalidOid: none): a
  // request that waited for a move that took it away still knows, should
  // Citus drop the old placement before the request looks again.
  Oid relation_before_lock;
  Oid local_relation; // after the lock
  bool placed_here;   // whether Citus's metadata places the shard here
};
ShardPlacement lock_shard_of_value(Oid relid, Oid owner, Oid type, Datum value);

// --- Citus's metadata, which every role may read --------------------------

// This node's group (0: the coordinator); an error without pg_dist_local_group.
int32 local_group();

// The relations here of the shards of `relid` (a List of Oids), including those
// of a shard Citus is moving here or moved away and has not dropped yet.
List *local_shard_relations(Oid relid);

enum class TableKind {
  not_citus,     // not in Citus's metadata, or Citus is not installed
  distributed,   // hash-, range- or append-distributed, or single-shard
  reference,     // a reference table: a copy on every node
  managed_local, // a local table added to Citus's metadata (a shard of its own)
};

// Whether or not the Citus library is loaded: the metadata decides where the
// rows are (a table Citus has taken over keeps them in shards).
TableKind table_kind(Oid relid);

// 0A000: idempotency.keys is a Citus table of this kind.
[[noreturn]] void report_citus_table(TableKind kind);

// For the expiry worker's log and status.
const char *citus_table_message(TableKind kind);

} // namespace idempotency::storage::citus
