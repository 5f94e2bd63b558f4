// One row written into a table through PostgreSQL's executor, as logical
// replication's apply writes it: BEFORE and AFTER row triggers fire (and the
// statement triggers, as for an INSERT of one row), stored generated columns
// are computed, constraints are checked, and the row goes into the heap and
// every index that is ready for inserts (unique and exclusion checks
// included). The key tables write their rows this way instead of through an
// INSERT statement, which would be parsed and planned (and, on Citus,
// deparsed and planned again for the shard) on every call.
//
//   RowInsert insert = begin_row_insert(rel, InvalidOid);
//   ... set insert.slot's values (clear_row, then the columns) ...
//   if (fire_before_row_triggers(insert, key_columns, n) != TriggeredRow::kept)
//     ... raise: the row was skipped or moved ...
//   write_row(insert);
//   ... read the row as written from insert.slot ...
//   end_row_insert(insert);
#pragma once

#include "idempotency/pg.hpp"
#include "idempotency/storage/key_store.hpp"

extern "C" {
#include "nodes/execnodes.h"
#include "utils/relcache.h"
}

namespace idempotency::storage {

struct RowInsert {
  EState *estate;
  ResultRelInfo *target;
  TupleTableSlot *slot; // the row to write, a virtual slot of the table
  TransitionCaptureState *transitions; // nullptr: no transition tables
};
static_assert(std::is_trivially_destructible_v<RowInsert>);

// The executor state for one row of `rel` (opened by the caller with
// RowExclusiveLock), with its indexes open and an AFTER trigger query level
// of its own; fires the BEFORE INSERT statement triggers. The triggers whose
// function is `left_out_function` (InvalidOid: none) do not fire.
RowInsert begin_row_insert(Relation rel, Oid left_out_function);

// Empties insert.slot: every column NULL, to be filled by the caller and
// stored with ExecStoreVirtualTuple.
void clear_row(const RowInsert &insert);

// A column's default, planned: what an INSERT that does not name the
// column stores in it.
struct DefaultColumn {
  AttrNumber attnum;
  Expr *expression;
};
static_assert(std::is_trivially_destructible_v<DefaultColumn>);

// The defaults of the columns of `rel` that `is_set` says the caller does
// not set, planned in the current memory context, into *defaults; returns
// how many. Columns without a default are stored NULL (a NOT NULL
// constraint then refuses the row); generated columns are computed by
// write_row().
int plan_defaults(Relation rel,
                  bool (*is_set)(const void *context, AttrNumber attnum),
                  const void *context, DefaultColumn **defaults);

// Evaluates planned defaults into insert.slot.
void evaluate_defaults(const RowInsert &insert, const DefaultColumn *defaults,
                       int count);

// Fires the BEFORE INSERT row triggers (if any) on insert.slot, which they
// may change, except for the `fixed_count` columns `fixed`: a key's row may
// not be dropped or moved to another key, or a retry of the key would run
// its request again.
TriggeredRow fire_before_row_triggers(const RowInsert &insert,
                                      const AttrNumber *fixed, int fixed_count);

// Computes the stored generated columns, checks the constraints, writes
// the row into the heap and the indexes and queues the AFTER row triggers.
void write_row(const RowInsert &insert);

// Fires the AFTER statement triggers and the queued AFTER row triggers, and
// frees the executor state.
void end_row_insert(RowInsert &insert);

} // namespace idempotency::storage
