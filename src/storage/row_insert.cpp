#include "idempotency/storage/row_insert.hpp"

#include "idempotency/compat.hpp"

extern "C" {
#include "access/htup_details.h"
#include "access/tableam.h"
#include "catalog/pg_trigger.h"
#include "commands/trigger.h"
#include "executor/executor.h"
#include "executor/nodeModifyTable.h"
#include "nodes/makefuncs.h"
#include "optimizer/optimizer.h"
#include "rewrite/rewriteHandler.h"
#include "utils/builtins.h"
#include "utils/datum.h"
#include "utils/rel.h"
}

namespace idempotency::storage {

namespace {

// Disables the triggers of `function` in the result relation's own copy of
// the table's triggers (InitResultRelInfo copies them), which the executor
// then skips as it skips any disabled trigger; the other triggers fire as
// they would for an INSERT. With no other trigger, the copy goes, so that a
// key's insert pays for no trigger machinery at all.
void leave_out(ResultRelInfo *target, Oid function) {
  TriggerDesc *triggers = target->ri_TrigDesc;
  if (triggers == nullptr || !OidIsValid(function))
    return;
  int enabled = 0;
  for (int i = 0; i < triggers->numtriggers; i++) {
    Trigger &trigger = triggers->triggers[i];
    if (trigger.tgfoid == function)
      trigger.tgenabled = TRIGGER_DISABLED;
    if (trigger.tgenabled != TRIGGER_DISABLED)
      enabled++;
  }
  if (enabled == 0)
    target->ri_TrigDesc = nullptr;
}

// The row to write, without its trailing NULL columns: a heap tuple whose
// null bitmap covers eight columns or fewer fits it in the header's
// padding (24 bytes), nine take 32. idempotency.keys has eight or nine
// (with a dropped column in tables updated from the earliest versions),
// the last of them status, which only dumps name (always NULL), so a call
// writes status NULL and each key would take 8 bytes more than it needs. A
// column missing from a tuple reads as NULL, as after ADD COLUMN; a column with
// a missing value (ADD COLUMN ... DEFAULT) must be kept, since it would read as
// that value.
TupleTableSlot *without_trailing_nulls(const RowInsert &insert) {
  TupleTableSlot *slot = insert.slot;
  TupleDesc desc = slot->tts_tupleDescriptor;
  slot_getallattrs(slot);
  int stored = desc->natts;
  while (stored > 0 && slot->tts_isnull[stored - 1] &&
         !TupleDescAttr(desc, stored - 1)->atthasmissing)
    stored--;
  auto header_size = [](int natts) {
    return MAXALIGN(SizeofHeapTupleHeader + BITMAPLEN(natts));
  };
  if (header_size(stored) == header_size(desc->natts))
    return slot;
  TupleDesc narrow = CreateTemplateTupleDesc(stored);
  for (int attnum = 1; attnum <= stored; attnum++)
    TupleDescCopyEntry(narrow, attnum, desc, attnum);
  HeapTuple tuple = heap_form_tuple(narrow, slot->tts_values, slot->tts_isnull);
  TupleTableSlot *heap_slot =
      ExecInitExtraTupleSlot(insert.estate, desc, &TTSOpsHeapTuple);
  ExecStoreHeapTuple(tuple, heap_slot, true);
  return heap_slot;
}

} // namespace

RowInsert begin_row_insert(Relation rel, Oid left_out_function) {
  RowInsert insert;
  insert.estate = CreateExecutorState();
  RangeTblEntry *entry = makeNode(RangeTblEntry);
  entry->rtekind = RTE_RELATION;
  entry->relid = RelationGetRelid(rel);
  entry->relkind = rel->rd_rel->relkind;
  entry->rellockmode = RowExclusiveLock;
  List *perm_infos = NIL;
  compat::addRTEPermissionInfo(&perm_infos, entry);
  compat::ExecInitRangeTable(insert.estate, list_make1(entry), perm_infos,
                             bms_make_singleton(1));

  insert.target = makeNode(ResultRelInfo);
  InitResultRelInfo(insert.target, rel, 1, nullptr, 0);
  leave_out(insert.target, left_out_function);
  // Lets AFTER triggers find the relation (ExecGetTriggerResultRel).
  insert.estate->es_opened_result_relations = list_make1(insert.target);
  insert.estate->es_output_cid = GetCurrentCommandId(true);
  ExecOpenIndices(insert.target, false);
  insert.slot = ExecInitExtraTupleSlot(insert.estate, RelationGetDescr(rel),
                                       &TTSOpsVirtual);
  AfterTriggerBeginQuery();
  // Statement triggers fire as for an INSERT of one row (as COPY fires
  // them), with the row in their transition table.
  insert.transitions = MakeTransitionCaptureState(
      insert.target->ri_TrigDesc, RelationGetRelid(rel), CMD_INSERT);
  ExecBSInsertTriggers(insert.estate, insert.target);
  return insert;
}

void clear_row(const RowInsert &insert) {
  TupleTableSlot *slot = insert.slot;
  ExecClearTuple(slot);
  int natts = slot->tts_tupleDescriptor->natts;
  for (int i = 0; i < natts; i++) {
    slot->tts_values[i] = (Datum)0;
    slot->tts_isnull[i] = true;
  }
}

int plan_defaults(Relation rel,
                  bool (*is_set)(const void *context, AttrNumber attnum),
                  const void *context, DefaultColumn **defaults) {
  TupleDesc desc = RelationGetDescr(rel);
  *defaults = static_cast<DefaultColumn *>(
      palloc(sizeof(DefaultColumn) * Max(desc->natts, 1)));
  int count = 0;
  for (int i = 0; i < desc->natts; i++) {
    Form_pg_attribute attribute = TupleDescAttr(desc, i);
    if (attribute->attisdropped || attribute->attgenerated != '\0' ||
        is_set(context, attribute->attnum))
      continue;
    Node *expression = build_column_default(rel, attribute->attnum);
    if (expression == nullptr)
      continue;
    (*defaults)[count++] =
        DefaultColumn{attribute->attnum,
                      expression_planner(reinterpret_cast<Expr *>(expression))};
  }
  return count;
}

void evaluate_defaults(const RowInsert &insert, const DefaultColumn *defaults,
                       int count) {
  TupleTableSlot *slot = insert.slot;
  ExprContext *econtext = GetPerTupleExprContext(insert.estate);
  // The expressions' states and values go with the executor state.
  MemoryContext previous = MemoryContextSwitchTo(insert.estate->es_query_cxt);
  for (int i = 0; i < count; i++) {
    AttrNumber attnum = defaults[i].attnum;
    ExprState *state = ExecInitExpr(defaults[i].expression, nullptr);
    slot->tts_values[attnum - 1] =
        ExecEvalExpr(state, econtext, &slot->tts_isnull[attnum - 1]);
  }
  MemoryContextSwitchTo(previous);
}

TriggeredRow fire_before_row_triggers(const RowInsert &insert,
                                      const AttrNumber *fixed,
                                      int fixed_count) {
  TriggerDesc *triggers = insert.target->ri_TrigDesc;
  if (triggers == nullptr || !triggers->trig_insert_before_row)
    return TriggeredRow::kept;
  TupleTableSlot *slot = insert.slot;
  TupleDesc desc = slot->tts_tupleDescriptor;
  // The values the caller set: the triggers replace the slot's contents,
  // not the memory these point to.
  slot_getallattrs(slot);
  Datum *before = static_cast<Datum *>(palloc(sizeof(Datum) * fixed_count));
  bool *before_null = static_cast<bool *>(palloc(sizeof(bool) * fixed_count));
  for (int i = 0; i < fixed_count; i++) {
    before[i] = slot->tts_values[fixed[i] - 1];
    before_null[i] = slot->tts_isnull[fixed[i] - 1];
  }
  if (!ExecBRInsertTriggers(insert.estate, insert.target, slot))
    return TriggeredRow::skipped;
  slot_getallattrs(slot);
  for (int i = 0; i < fixed_count; i++) {
    Form_pg_attribute attribute = TupleDescAttr(desc, fixed[i] - 1);
    bool is_null = slot->tts_isnull[fixed[i] - 1];
    if (is_null != before_null[i] ||
        (!is_null && !datum_image_eq(before[i], slot->tts_values[fixed[i] - 1],
                                     attribute->attbyval, attribute->attlen)))
      return TriggeredRow::moved;
  }
  return TriggeredRow::kept;
}

// What ExecSimpleRelationInsert does after the BEFORE row triggers.
void write_row(const RowInsert &insert) {
  ResultRelInfo *target = insert.target;
  Relation rel = target->ri_RelationDesc;
  EState *estate = insert.estate;
  TupleConstr *constraints = RelationGetDescr(rel)->constr;
  if (constraints != nullptr && constraints->has_generated_stored)
    ExecComputeStoredGenerated(target, estate, insert.slot, CMD_INSERT);
  if (constraints != nullptr)
    ExecConstraints(target, insert.slot, estate);

  TupleTableSlot *slot = without_trailing_nulls(insert);
  simple_table_tuple_insert(rel, slot);
  List *recheck = NIL;
  if (target->ri_NumIndices > 0)
    recheck = compat::ExecInsertIndexTuples(target, estate, 0 /* flags */, slot,
                                            NIL, nullptr);
  ExecARInsertTriggers(estate, target, slot, recheck, insert.transitions);
  list_free(recheck);
}

void end_row_insert(RowInsert &insert) {
  ExecASInsertTriggers(insert.estate, insert.target, insert.transitions);
  AfterTriggerEndQuery(insert.estate);
  ExecCloseIndices(insert.target);
  ExecResetTupleTable(insert.estate->es_tupleTable, false);
  FreeExecutorState(insert.estate);
}

} // namespace idempotency::storage
