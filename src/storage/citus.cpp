#include "idempotency/storage/citus_version.hpp"

#include "idempotency/storage/citus.hpp"

#include "idempotency/storage/columns.hpp"
#include "idempotency/storage/table_owner.hpp"

extern "C" {
#include "access/genam.h"
#include "access/htup_details.h"
#include "access/table.h"
#include "access/xact.h"
#include "catalog/pg_namespace.h"
#include "catalog/pg_type.h"
#include "funcapi.h"
#include "miscadmin.h"
#include "nodes/makefuncs.h"
#include "parser/parse_func.h"
#include "storage/lmgr.h"
#include "utils/array.h"
#include "utils/fmgroids.h"
#include "utils/guc.h"
#include "utils/inval.h"
#include "utils/lsyscache.h"
#include "utils/memutils.h"
#include "utils/rel.h"
#include "utils/varlena.h"
}

namespace idempotency::storage::citus {

namespace {

// --- Citus's transaction manager ---------------------------------------------
//
// Two functions Citus exports (transaction/transaction_management.c):
// InCoordinatedTransaction() says whether the transaction has opened
// transactions on other nodes, which Citus will finish from its callback at
// XACT_EVENT_PRE_COMMIT; Use2PCForCoordinatedTransaction() makes that
// callback PREPARE every remote transaction that wrote something before the
// local commit, and COMMIT PREPARED them after it, instead of committing
// them with a plain COMMIT before the local commit. Citus resets the flag
// when the transaction ends; on its own it sets it only for writes it
// executes (on more than one node, or on a shard of this node), never for
// a write to a table outside its metadata such as idempotency.keys.

using InCoordinatedTransaction = bool (*)();
using Use2PCForCoordinatedTransaction = void (*)();

struct TransactionManager {
  InCoordinatedTransaction in_coordinated_transaction;
  Use2PCForCoordinatedTransaction use_two_phase_commit;
};

enum class Presence { unknown, absent, present };

Presence presence = Presence::unknown;
TransactionManager manager{};

// Whether the current transaction wrote idempotency.keys.
bool wrote_keys = false;

// The entry of shared_preload_libraries that loaded Citus, or nullptr. Citus
// refuses to be loaded any other way, and shared_preload_libraries cannot
// change while the server runs, so this entry is what the server loaded.
char *citus_library_entry() {
  if (!process_shared_preload_libraries_done ||
      shared_preload_libraries_string == nullptr)
    return nullptr;
  // SplitDirectoriesString splits as the server did when it loaded them.
  char *list = pstrdup(shared_preload_libraries_string);
  List *entries = NIL;
  if (!SplitDirectoriesString(list, ',', &entries))
    return nullptr;
  ListCell *cell;
  foreach (cell, entries) {
    char *entry = static_cast<char *>(lfirst(cell));
    const char *separator = last_dir_separator(entry);
    const char *name = separator != nullptr ? separator + 1 : entry;
    size_t length = strlen(name);
    size_t suffix = strlen(DLSUFFIX);
    if (length > suffix && strcmp(name + length - suffix, DLSUFFIX) == 0)
      length -= suffix;
    if (length == strlen("citus") && strncmp(name, "citus", length) == 0)
      return entry;
  }
  return nullptr;
}

// A function of the loaded Citus library (exported, not part of its SQL
// API), or nullptr when the library does not export it: Citus built for
// PostgreSQL 15 exports every function, built for 16 and later (whose
// build hides what a library does not mark for export) only the functions
// of its SQL API. load_external_function finds the library among those
// already loaded (same name, same file), so it never loads Citus here -
// which, outside shared_preload_libraries, Citus would refuse with an error.
void *citus_function(const char *entry, const char *name) {
  return reinterpret_cast<void *>(
      load_external_function(entry, name, false, nullptr));
}

// Looks Citus's functions up once per backend.
bool citus_loaded() {
  if (presence != Presence::unknown)
    return presence == Presence::present;
  char *entry = citus_library_entry();
  if (entry == nullptr) {
    presence = Presence::absent;
    return false;
  }
  TransactionManager found{};
  found.in_coordinated_transaction = reinterpret_cast<InCoordinatedTransaction>(
      citus_function(entry, "InCoordinatedTransaction"));
  found.use_two_phase_commit =
      reinterpret_cast<Use2PCForCoordinatedTransaction>(
          citus_function(entry, "Use2PCForCoordinatedTransaction"));
  if (found.in_coordinated_transaction == nullptr ||
      found.use_two_phase_commit == nullptr)
    found = TransactionManager{};
  manager = found;
  presence = Presence::present;
  return true;
}

// A function of Citus's SQL API in pg_catalog, by name and argument types.
Oid citus_sql_function(const char *name, int nargs, Oid *types) {
  List *qualified =
      list_make2(makeString(pstrdup("pg_catalog")), makeString(pstrdup(name)));
  return LookupFuncName(qualified, nargs, types, false);
}

int32 local_group_from_catalog();

// Whether the transaction is a Citus coordinated transaction that this
// backend started, as Citus's get_current_transaction_id() tells (SQL API):
// starting one gives the transaction a distributed transaction number
// (initiated by this node and backend); a transaction a coordinator opened
// here has one of the coordinator's.
bool coordinated_by_this_backend() {
  static Oid function = InvalidOid;
  if (!OidIsValid(function))
    function = citus_sql_function("get_current_transaction_id", 0, nullptr);
  HeapTupleHeader row = DatumGetHeapTupleHeader(OidFunctionCall0(function));
  bool isnull = true;
  Datum number = GetAttributeByName(row, "transaction_number", &isnull);
  if (isnull || DatumGetInt64(number) == 0)
    return false;
  Datum process = GetAttributeByName(row, "process_id", &isnull);
  if (isnull || DatumGetInt32(process) != MyProcPid)
    return false;
  Datum initiator =
      GetAttributeByName(row, "initiator_node_identifier", &isnull);
  return !isnull && DatumGetInt32(initiator) == local_group_from_catalog();
}

// Without Citus's transaction manager (a Citus library that does not export
// it), two-phase commit cannot be asked for: a key in idempotency.keys and
// remote work in one transaction would commit apart, so such a transaction
// is refused before it commits.
[[noreturn]] void report_no_two_phase_commit() {
  ereport(ERROR,
          (errcode(ERRCODE_FEATURE_NOT_SUPPORTED),
           errmsg("idempotency.keys cannot commit together with Citus's remote "
                  "writes in this server"),
           errdetail("The loaded Citus library does not export the functions "
                     "through which the extension asks Citus for two-phase "
                     "commit (Citus built for PostgreSQL 16 or later exports "
                     "only its SQL API): the workers' part would commit before "
                     "the key, and a crash in between would run the request "
                     "again."),
           errhint("Use tenant keys (tenant_call, tenant_claim; see the "
                   "extension's docs/scale-out.md), which commit in one local "
                   "transaction with the tenant's writes.")));
  pg_unreachable();
}

void use_two_phase_commit_if_coordinated() {
  if (manager.in_coordinated_transaction == nullptr) {
    if (coordinated_by_this_backend())
      report_no_two_phase_commit();
    return;
  }
  if (manager.in_coordinated_transaction())
    manager.use_two_phase_commit();
}

} // namespace

// Remote work may come after the key is written - claim() and complete()
// followed by an UPDATE of a distributed table, or deferred triggers - so
// the decision is made again when the transaction commits (deferred
// triggers have fired by then). entry/transaction.cpp says why this runs
// before Citus's own PRE_COMMIT callback.
void at_pre_commit() {
  if (wrote_keys)
    use_two_phase_commit_if_coordinated();
}

void at_transaction_end() { wrote_keys = false; }

void note_key_write() {
  if (!citus_loaded())
    return;
  // A write in a subtransaction that rolls back keeps the flag: the
  // transaction then uses two-phase commit where one-phase would have done,
  // which costs time, never correctness.
  wrote_keys = true;
  // Asked now as well: the work done so far (fn, for idempotent_call) is
  // covered even if another callback were to run before this one.
  use_two_phase_commit_if_coordinated();
}

namespace {
constexpr const char *opens_transaction_block =
    "citus.function_opens_transaction_block";
}

int begin_fn() {
  if (!citus_loaded() || IsTransactionBlock())
    return 0;
  const char *value = GetConfigOption(opens_transaction_block, true, false);
  if (value == nullptr || strcmp(value, "on") == 0)
    return 0;
  int level = NewGUCNestLevel();
  (void)set_config_option(opens_transaction_block, "on", PGC_USERSET,
                          PGC_S_SESSION, GUC_ACTION_SAVE, true, 0, false);
  return level;
}

void end_fn(int guc_level) {
  if (guc_level > 0)
    AtEOXact_GUC(true, guc_level);
}

// --- Citus's metadata
// ----------------------------------------------------------

namespace {

AttrNumber column_named(TupleDesc desc, const char *name) {
  Form_pg_attribute attribute = find_column(desc, name);
  return attribute == nullptr ? InvalidAttrNumber : attribute->attnum;
}

// partmethod 'n' is a table without a distribution column: a reference
// table (replicated to all nodes, repmodel 't'), a single-shard distributed
// table (it has a colocation group), or a local table Citus manages.
TableKind kind_of(Relation partition, HeapTuple tuple) {
  TupleDesc desc = RelationGetDescr(partition);
  AttrNumber method = column_named(desc, "partmethod");
  AttrNumber repmodel = column_named(desc, "repmodel");
  AttrNumber colocation = column_named(desc, "colocationid");
  if (method == InvalidAttrNumber || repmodel == InvalidAttrNumber ||
      colocation == InvalidAttrNumber)
    return TableKind::distributed; // a metadata layout not known here
  bool isnull = false;
  char partition_method =
      DatumGetChar(heap_getattr(tuple, method, desc, &isnull));
  if (partition_method != 'n')
    return TableKind::distributed;
  if (DatumGetChar(heap_getattr(tuple, repmodel, desc, &isnull)) == 't')
    return TableKind::reference;
  if (DatumGetInt32(heap_getattr(tuple, colocation, desc, &isnull)) != 0)
    return TableKind::distributed;
  return TableKind::managed_local;
}

} // namespace

TableKind table_kind(Oid relid) {
  Oid partition_oid =
      get_relname_relid("pg_dist_partition", PG_CATALOG_NAMESPACE);
  if (!OidIsValid(partition_oid))
    return TableKind::not_citus;
  Relation partition = table_open(partition_oid, AccessShareLock);
  AttrNumber logicalrelid =
      column_named(RelationGetDescr(partition), "logicalrelid");
  TableKind kind = TableKind::not_citus;
  if (logicalrelid != InvalidAttrNumber) {
    Oid index = get_relname_relid("pg_dist_partition_logical_relid_index",
                                  PG_CATALOG_NAMESPACE);
    ScanKeyData key;
    ScanKeyInit(&key, logicalrelid, BTEqualStrategyNumber, F_OIDEQ,
                ObjectIdGetDatum(relid));
    SysScanDesc scan = systable_beginscan(partition, index, OidIsValid(index),
                                          nullptr, 1, &key);
    HeapTuple tuple = systable_getnext(scan);
    if (tuple != nullptr)
      kind = kind_of(partition, tuple);
    systable_endscan(scan);
  }
  table_close(partition, AccessShareLock);
  return kind;
}

const char *citus_table_message(TableKind kind) {
  switch (kind) {
  case TableKind::reference:
    return "idempotency.keys is a Citus reference table";
  case TableKind::managed_local:
    return "idempotency.keys is a local table in Citus's metadata";
  case TableKind::distributed:
  case TableKind::not_citus:
    break;
  }
  return "idempotency.keys is a Citus distributed table";
}

void report_citus_table(TableKind kind) {
  ereport(ERROR,
          (errcode(ERRCODE_FEATURE_NOT_SUPPORTED),
           errmsg("%s", citus_table_message(kind)),
           errdetail("Citus keeps the table's rows in its shards, while "
                     "idempotency keys are read and written in this node's "
                     "own table: a key stored in one would be missed in the "
                     "other, and a retry could run its request again."),
           errhint("Make idempotency.keys a local table again with the steps "
                   "in the extension's docs/scale-out.md; undistribute_table "
                   "refuses a table that belongs to an extension.")));
  pg_unreachable();
}

// --- a shard of a hash-distributed table on this node
// --------------------------

namespace {

// Citus 13's LocalExecutionStatus (executor/local_executor.h): whether the
// transaction must, may or must not run statements on this node's shards in
// this backend.
enum LocalExecutionStatus : int {
  local_execution_required = 0,
  local_execution_optional = 1,
  local_execution_disabled = 2,
};

// Functions of the Citus library (exported, not part of its SQL API), found
// once per backend as the transaction manager's are.
struct ShardFunctions {
  // metadata/metadata_cache.c: this node's group, cached by Citus.
  int32 (*local_group_id)();
  // utils/resource_lock.c.
  void (*lock_shard_distribution_metadata)(int64 shard, LOCKMODE mode);
  // executor/local_executor.c.
  LocalExecutionStatus (*local_execution_status)();
  void (*set_local_execution_status)(LocalExecutionStatus status);
  // executor/multi_executor.c: refuses a distributed statement (isRemote:
  // false, a local one) where Citus allows none.
  void (*ensure_task_execution_allowed)(bool is_remote);
};

ShardFunctions shard_functions{};
bool shard_functions_found = false;

// This node's group in Citus's metadata, read from pg_dist_local_group (one
// row), as GetLocalGroupId() reads it.
int32 local_group_from_catalog() {
  Oid local_group_oid =
      get_relname_relid("pg_dist_local_group", PG_CATALOG_NAMESPACE);
  if (!OidIsValid(local_group_oid))
    elog(ERROR, "pg_catalog.pg_dist_local_group does not exist");
  Relation local_group = table_open(local_group_oid, AccessShareLock);
  TupleDesc desc = RelationGetDescr(local_group);
  AttrNumber groupid = column_named(desc, "groupid");
  if (groupid == InvalidAttrNumber)
    elog(ERROR, "pg_dist_local_group has no column groupid");
  SysScanDesc scan =
      systable_beginscan(local_group, InvalidOid, false, nullptr, 0, nullptr);
  HeapTuple tuple = systable_getnext(scan);
  bool isnull = true;
  int32 group = -1;
  if (tuple != nullptr) {
    Datum value = heap_getattr(tuple, groupid, desc, &isnull);
    if (!isnull)
      group = DatumGetInt32(value);
  }
  systable_endscan(scan);
  table_close(local_group, AccessShareLock);
  return group;
}

const ShardFunctions &shards() {
  if (shard_functions_found)
    return shard_functions;
  require_tested_citus();
  char *entry = citus_library_entry();
  ShardFunctions found{};
  found.local_group_id =
      reinterpret_cast<int32 (*)()>(citus_function(entry, "GetLocalGroupId"));
  found.lock_shard_distribution_metadata =
      reinterpret_cast<void (*)(int64, LOCKMODE)>(
          citus_function(entry, "LockShardDistributionMetadata"));
  found.local_execution_status = reinterpret_cast<LocalExecutionStatus (*)()>(
      citus_function(entry, "GetCurrentLocalExecutionStatus"));
  found.set_local_execution_status =
      reinterpret_cast<void (*)(LocalExecutionStatus)>(
          citus_function(entry, "SetLocalExecutionStatus"));
  found.ensure_task_execution_allowed = reinterpret_cast<void (*)(bool)>(
      citus_function(entry, "EnsureTaskExecutionAllowed"));
  // All three or none: a write in the local shard needs each.
  if (found.local_execution_status == nullptr ||
      found.set_local_execution_status == nullptr ||
      found.ensure_task_execution_allowed == nullptr) {
    found.local_execution_status = nullptr;
    found.set_local_execution_status = nullptr;
    found.ensure_task_execution_allowed = nullptr;
  }
  shard_functions = found;
  shard_functions_found = true;
  return shard_functions;
}

// pg_catalog.get_shard_id_for_distribution_column(regclass, "any"), called
// through the function manager. It reads its second argument's type from
// the call expression, so the FmgrInfo carries one, made for the type of
// the last call (a database's tenant keys have one type).
struct ShardIdFunction {
  bool ready;
  Oid value_type;
  FmgrInfo info;
};
ShardIdFunction shard_id_function{};

void prepare_shard_id_function(Oid type) {
  if (shard_id_function.ready && shard_id_function.value_type == type)
    return;
  shard_id_function.ready = false;
  Oid argument_types[2] = {REGCLASSOID, ANYOID};
  List *name =
      list_make2(makeString(pstrdup("pg_catalog")),
                 makeString(pstrdup("get_shard_id_for_distribution_column")));
  Oid function = LookupFuncName(name, 2, argument_types, false);
  MemoryContext saved = MemoryContextSwitchTo(TopMemoryContext);
  fmgr_info(function, &shard_id_function.info);
  List *arguments = list_make2(makeNullConst(REGCLASSOID, -1, InvalidOid),
                               makeNullConst(type, -1, get_typcollation(type)));
  fmgr_info_set_expr(reinterpret_cast<Node *>(
                         makeFuncExpr(function, INT8OID, arguments, InvalidOid,
                                      InvalidOid, COERCE_EXPLICIT_CALL)),
                     &shard_id_function.info);
  MemoryContextSwitchTo(saved);
  shard_id_function.value_type = type;
  shard_id_function.ready = true;
}

} // namespace

uint64 shard_for_value(Oid relid, Oid type, Datum value) {
  prepare_shard_id_function(type);
  LOCAL_FCINFO(call, 2);
  InitFunctionCallInfoData(*call, &shard_id_function.info, 2, InvalidOid,
                           nullptr, nullptr);
  call->args[0].value = ObjectIdGetDatum(relid);
  call->args[0].isnull = false;
  call->args[1].value = value;
  call->args[1].isnull = false;
  Datum shard = FunctionCallInvoke(call);
  if (call->isnull)
    elog(ERROR, "get_shard_id_for_distribution_column returned NULL");
  return static_cast<uint64>(DatumGetInt64(shard));
}

void require_tested_citus() {
  if (!citus_loaded())
    ereport(ERROR, (errcode(ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE),
                    errmsg("Citus is not loaded in this server"),
                    errhint("Add citus to shared_preload_libraries.")));
  const char *version = GetConfigOption("citus.version", true, false);
  if (check_citus_version(version, nullptr) == CitusVersionCheck::tested)
    return;
  ereport(ERROR,
          (errcode(ERRCODE_FEATURE_NOT_SUPPORTED),
           errmsg("tenant keys do not support Citus %s",
                  version != nullptr ? version : "of an unknown version"),
           errdetail("Tenant keys read and write Citus's shards with Citus's "
                     "catalogs, locks and functions as the Citus versions "
                     "they were tested with have them."),
           errhint("Use Citus %s (SHOW citus.version), or keep the keys on "
                   "the coordinator (idempotent_call, claim, complete). See "
                   "the extension's docs/scale-out.md.",
                   tested_citus_versions)));
}

void lock_shard_placement(uint64 shard, Oid owner) {
  const ShardFunctions &citus = shards();
  if (citus.lock_shard_distribution_metadata != nullptr) {
    citus.lock_shard_distribution_metadata(static_cast<int64>(shard),
                                           ShareLock);
  } else {
    // pg_catalog.lock_shard_metadata(lock_mode, shard_ids) of Citus's SQL
    // API takes the same lock (LockShardDistributionMetadata). It requires
    // the table's owner, whom the caller has made the current user.
    static Oid function = InvalidOid;
    if (!OidIsValid(function)) {
      Oid types[2] = {INT4OID, INT8ARRAYOID};
      function = citus_sql_function("lock_shard_metadata", 2, types);
    }
    Datum shard_datum = Int64GetDatum(static_cast<int64>(shard));
    ArrayType *shards_array = construct_array(
        &shard_datum, 1, INT8OID, sizeof(int64), true, TYPALIGN_DOUBLE);
    table_owner::Saved saved = table_owner::become(owner);
    OidFunctionCall2(function, Int32GetDatum(ShareLock),
                     PointerGetDatum(shards_array));
    table_owner::restore(saved);
  }
  // Citus takes the lock as an advisory lock, which, unlike a relation's,
  // does not take in the invalidations of the transactions it waited for.
  AcceptInvalidationMessages();
}

int32 local_group() { return local_group_from_catalog(); }

Oid shard_relation(Oid relid, uint64 shard) {
  char name[NAMEDATALEN];
  snprintf(name, sizeof name, "%s_" UINT64_FORMAT, get_rel_name(relid), shard);
  return get_relname_relid(name, get_rel_namespace(relid));
}

ShardRelations local_shard_relations(Oid relid) {
  ShardRelations found{0, nullptr};
  Oid shard_oid = get_relname_relid("pg_dist_shard", PG_CATALOG_NAMESPACE);
  if (!OidIsValid(shard_oid))
    return found;
  Relation shards = table_open(shard_oid, AccessShareLock);
  TupleDesc desc = RelationGetDescr(shards);
  AttrNumber logicalrelid = column_named(desc, "logicalrelid");
  AttrNumber shardid = column_named(desc, "shardid");
  if (logicalrelid == InvalidAttrNumber || shardid == InvalidAttrNumber)
    elog(ERROR, "pg_dist_shard has no column logicalrelid or shardid");
  Oid index = get_relname_relid("pg_dist_shard_logical_relid_index",
                                PG_CATALOG_NAMESPACE);
  ScanKeyData key;
  ScanKeyInit(&key, logicalrelid, BTEqualStrategyNumber, F_OIDEQ,
              ObjectIdGetDatum(relid));
  SysScanDesc scan =
      systable_beginscan(shards, index, OidIsValid(index), nullptr, 1, &key);
  int allocated = 0;
  for (HeapTuple tuple = systable_getnext(scan); tuple != nullptr;
       tuple = systable_getnext(scan)) {
    bool isnull = true;
    Datum shard = heap_getattr(tuple, shardid, desc, &isnull);
    if (isnull)
      continue;
    Oid shard_relid =
        shard_relation(relid, static_cast<uint64>(DatumGetInt64(shard)));
    if (!OidIsValid(shard_relid))
      continue;
    if (found.count == allocated) {
      allocated = allocated == 0 ? 16 : allocated * 2;
      found.relids = static_cast<Oid *>(
          found.relids == nullptr
              ? palloc(sizeof(Oid) * allocated)
              : repalloc(found.relids, sizeof(Oid) * allocated));
    }
    found.relids[found.count++] = shard_relid;
  }
  systable_endscan(scan);
  table_close(shards, AccessShareLock);
  return found;
}

ShardPlacements shard_placements(uint64 shard) {
  const ShardFunctions &citus = shards();
  int32 group = citus.local_group_id != nullptr ? citus.local_group_id()
                                                : local_group_from_catalog();
  Oid placement_oid =
      get_relname_relid("pg_dist_placement", PG_CATALOG_NAMESPACE);
  ShardPlacements placed{false, 0};
  if (!OidIsValid(placement_oid))
    return placed;
  // pg_dist_placement has no system cache: a scan without a snapshot of its
  // own takes a new catalog snapshot (GetCatalogSnapshot).
  Relation placements = table_open(placement_oid, AccessShareLock);
  TupleDesc desc = RelationGetDescr(placements);
  AttrNumber shardid = column_named(desc, "shardid");
  AttrNumber groupid = column_named(desc, "groupid");
  if (shardid == InvalidAttrNumber || groupid == InvalidAttrNumber)
    elog(ERROR, "pg_dist_placement has no column shardid or groupid");
  Oid index = get_relname_relid("pg_dist_placement_shardid_index",
                                PG_CATALOG_NAMESPACE);
  ScanKeyData key;
  ScanKeyInit(&key, shardid, BTEqualStrategyNumber, F_INT8EQ,
              Int64GetDatum(static_cast<int64>(shard)));
  SysScanDesc scan = systable_beginscan(placements, index, OidIsValid(index),
                                        nullptr, 1, &key);
  for (HeapTuple tuple = systable_getnext(scan); tuple != nullptr;
       tuple = systable_getnext(scan)) {
    bool isnull = true;
    Datum placement_group = heap_getattr(tuple, groupid, desc, &isnull);
    placed.here |= !isnull && DatumGetInt32(placement_group) == group;
    placed.count++;
  }
  systable_endscan(scan);
  table_close(placements, AccessShareLock);
  return placed;
}

bool may_write_local_shard() {
  const ShardFunctions &citus = shards();
  if (citus.ensure_task_execution_allowed == nullptr)
    return false;
  citus.ensure_task_execution_allowed(false);
  const char *local_execution =
      GetConfigOption("citus.enable_local_execution", true, false);
  if (local_execution == nullptr || strcmp(local_execution, "on") != 0)
    return false;
  return citus.local_execution_status() != local_execution_disabled;
}

void note_local_shard_write() {
  const ShardFunctions &citus = shards();
  if (citus.set_local_execution_status == nullptr)
    elog(ERROR, "note_local_shard_write without may_write_local_shard");
  citus.set_local_execution_status(local_execution_required);
  note_key_write();
}

} // namespace idempotency::storage::citus
