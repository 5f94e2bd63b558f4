#include "idempotency/storage/citus_version.hpp"

#include "idempotency/storage/citus.hpp"

#include "idempotency/storage/owner_statements.hpp"

extern "C" {
#include "access/xact.h"
#include "catalog/pg_namespace.h"
#include "catalog/pg_type.h"
#include "executor/spi.h"
#include "funcapi.h"
#include "miscadmin.h"
#include "nodes/makefuncs.h"
#include "parser/parse_func.h"
#include "storage/lmgr.h"
#include "utils/guc.h"
#include "utils/inval.h"
#include "utils/lsyscache.h"
#include "utils/snapmgr.h"
#include "utils/varlena.h"
}

namespace idempotency::storage::citus {

namespace {

// InCoordinatedTransaction(): whether the transaction opened transactions on
// other nodes; Use2PCForCoordinatedTransaction() makes Citus PREPARE them
// before the local commit, COMMIT PREPARED after it; for this transaction only.

enum class Presence { unknown, absent, present };

Presence presence = Presence::unknown;
// nullptr when the library does not export them.
bool (*in_coordinated_transaction)() = nullptr;
void (*use_two_phase_commit)() = nullptr;

bool wrote_keys = false;

// The entry of shared_preload_libraries that loaded Citus, or nullptr: Citus
// loads no other way, and the setting is fixed while the server runs.
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
    if (strcmp(name, "citus") == 0 || strcmp(name, "citus" DLSUFFIX) == 0)
      return entry;
  }
  return nullptr;
}

bool citus_loaded() {
  if (presence != Presence::unknown)
    return presence == Presence::present;
  char *entry = citus_library_entry();
  if (entry == nullptr) {
    presence = Presence::absent;
    return false;
  }
  // load_external_function finds the library among those already loaded,
  // so it never loads Citus here, which Citus would refuse with an error.
  void *in_coordinated =
      load_external_function(entry, "InCoordinatedTransaction", false, nullptr);
  void *use_2pc = load_external_function(
      entry, "Use2PCForCoordinatedTransaction", false, nullptr);
  if (in_coordinated != nullptr && use_2pc != nullptr) {
    in_coordinated_transaction = reinterpret_cast<bool (*)()>(in_coordinated);
    use_two_phase_commit = reinterpret_cast<void (*)()>(use_2pc);
  }
  presence = Presence::present;
  return true;
}

// Read when the transaction first wrote a key, where the transaction
// manager is not exported: at PRE_COMMIT no statement runs.
int32 group_of_key_writer = -1;

// Starting a coordinated transaction gives it a distributed transaction
// number initiated by this node and backend; a transaction a coordinator
// opened here has one of the coordinator's.
bool coordinated_by_this_backend() {
  static Oid function = InvalidOid;
  if (!OidIsValid(function))
    function = LookupFuncName(
        list_make2(makeString(pstrdup("pg_catalog")),
                   makeString(pstrdup("get_current_transaction_id"))),
        0, nullptr, false);
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
  return !isnull && DatumGetInt32(initiator) == group_of_key_writer;
}

void use_two_phase_commit_if_coordinated() {
  if (in_coordinated_transaction == nullptr) {
    if (coordinated_by_this_backend())
      ereport(
          ERROR,
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
    return;
  }
  if (in_coordinated_transaction())
    use_two_phase_commit();
}

constexpr const char *opens_transaction_block =
    "citus.function_opens_transaction_block";

} // namespace

// Remote work may follow the key's write (an UPDATE after complete(), deferred
// triggers); entry/transaction.cpp says why this runs before Citus's callback.
void at_pre_commit() {
  if (wrote_keys)
    use_two_phase_commit_if_coordinated();
}

void at_transaction_end() { wrote_keys = false; }

void note_key_write() {
  if (!citus_loaded())
    return;
  if (!wrote_keys && in_coordinated_transaction == nullptr)
    group_of_key_writer = local_group();
  // A write in a subtransaction that rolls back keeps the flag: needless
  // two-phase commit costs time, never correctness.
  wrote_keys = true;
  // Asked now as well: the work done so far (fn, for idempotent_call) is
  // covered even if another callback were to run before this one.
  use_two_phase_commit_if_coordinated();
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

// Citus's metadata is read through its SQL API with a snapshot taken at the
// statement, as a catalog scan would: a shard move that committed before a
// lock was granted is seen, at any isolation level.

namespace {

struct MetadataStatement {
  const char *sql;
  int nargs;
  Oid types[2];
  SPIPlanPtr plan;
};

SPIPlanPtr kept_plan(MetadataStatement &statement) {
  if (statement.plan != nullptr)
    return statement.plan;
  SPIPlanPtr plan =
      SPI_prepare(statement.sql, statement.nargs, statement.types);
  if (plan == nullptr || SPI_keepplan(plan) != 0)
    elog(ERROR, "preparing a statement on Citus's metadata failed: %s",
         SPI_result_code_string(SPI_result));
  statement.plan = plan;
  return plan;
}

void read_now(MetadataStatement &statement, Datum *values) {
  int rc = SPI_execute_snapshot(kept_plan(statement), values, nullptr,
                                GetLatestSnapshot(), InvalidSnapshot, true,
                                false, 0);
  if (rc != SPI_OK_SELECT)
    elog(ERROR, "a statement on Citus's metadata failed: %s",
         SPI_result_code_string(rc));
}

void connect_spi() {
  if (SPI_connect() != SPI_OK_CONNECT)
    elog(ERROR, "SPI_connect failed");
}

// The first row of `statement` as `owner` (InvalidOid: current user), or nulls.
template <int N>
void read_first_row(MetadataStatement &statement, Datum *args, Oid owner,
                    Datum (&row)[N], bool (&nulls)[N]) {
  table_owner::Saved saved{};
  if (OidIsValid(owner))
    saved = table_owner::begin_spi(owner);
  else
    connect_spi();
  read_now(statement, args);
  TupleDesc desc = SPI_tuptable->tupdesc;
  for (int i = 0; i < N; i++) {
    nulls[i] = true;
    row[i] = SPI_processed == 0
                 ? (Datum)0
                 : SPI_getbinval(SPI_tuptable->vals[0], desc, i + 1, &nulls[i]);
    if (!nulls[i])
      row[i] = SPI_datumTransfer(row[i], TupleDescAttr(desc, i)->attbyval,
                                 TupleDescAttr(desc, i)->attlen);
  }
  if (OidIsValid(owner))
    table_owner::finish_spi(saved);
  else
    SPI_finish();
}

MetadataStatement partition_of_table{
    "SELECT p.partmethod, p.repmodel, p.colocationid"
    " FROM pg_catalog.pg_dist_partition p"
    " WHERE p.logicalrelid OPERATOR(pg_catalog.=) $1",
    1,
    {OIDOID},
    nullptr};

MetadataStatement local_group_row{
    "SELECT g.groupid FROM pg_catalog.pg_dist_local_group g", 0, {}, nullptr};

// get_shard_id_for_distribution_column takes "any": one plan per tenant type.
MetadataStatement shard_of_value{
    "SELECT s.id, pg_catalog.to_regclass(pg_catalog.shard_name($1, s.id))"
    " FROM pg_catalog.get_shard_id_for_distribution_column($1, $2) AS s(id)",
    2,
    {REGCLASSOID, InvalidOid},
    nullptr};

MetadataStatement shard_here{
    "SELECT pg_catalog.to_regclass(pg_catalog.shard_name($1, $2)),"
    " EXISTS (SELECT FROM pg_catalog.pg_dist_placement p,"
    " pg_catalog.pg_dist_local_group g"
    " WHERE p.shardid OPERATOR(pg_catalog.=) $2"
    " AND p.groupid OPERATOR(pg_catalog.=) g.groupid)",
    2,
    {REGCLASSOID, INT8OID},
    nullptr};

MetadataStatement local_shards{
    "SELECT r FROM (SELECT pg_catalog.to_regclass(pg_catalog.shard_name("
    "s.logicalrelid, s.shardid)) AS r FROM pg_catalog.pg_dist_shard s"
    " WHERE s.logicalrelid OPERATOR(pg_catalog.=) $1) AS shards"
    " WHERE r IS NOT NULL",
    1,
    {REGCLASSOID},
    nullptr};

MetadataStatement lock_metadata{
    "SELECT pg_catalog.lock_shard_metadata($1, ARRAY[$2])",
    2,
    {INT4OID, INT8OID},
    nullptr};

} // namespace

TableKind table_kind(Oid relid) {
  if (!OidIsValid(get_relname_relid("pg_dist_partition", PG_CATALOG_NAMESPACE)))
    return TableKind::not_citus;
  Datum args[1] = {ObjectIdGetDatum(relid)};
  Datum row[3];
  bool nulls[3];
  read_first_row(partition_of_table, args, InvalidOid, row, nulls);
  if (nulls[0])
    return TableKind::not_citus;
  // partmethod 'n': a reference table (repmodel 't'), a single-shard
  // distributed table (it has a colocation group), or a managed local table.
  if (DatumGetChar(row[0]) != 'n')
    return TableKind::distributed;
  if (DatumGetChar(row[1]) == 't')
    return TableKind::reference;
  if (DatumGetInt32(row[2]) != 0)
    return TableKind::distributed;
  return TableKind::managed_local;
}

const char *citus_table_message(TableKind kind) {
  if (kind == TableKind::reference)
    return "idempotency.keys is a Citus reference table";
  if (kind == TableKind::managed_local)
    return "idempotency.keys is a local table in Citus's metadata";
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
           errdetail("Tenant keys read Citus's metadata and take its locks "
                     "through its SQL API as the Citus versions they were "
                     "tested with have it."),
           errhint("Use Citus %s (SHOW citus.version), or keep the keys on "
                   "the coordinator (idempotent_call, claim, complete). See "
                   "the extension's docs/scale-out.md.",
                   tested_citus_versions)));
}

ShardPlacement lock_shard_of_value(Oid relid, Oid owner, Oid type,
                                   Datum value) {
  if (shard_of_value.types[1] != type && shard_of_value.plan != nullptr) {
    SPI_freeplan(shard_of_value.plan);
    shard_of_value.plan = nullptr;
  }
  shard_of_value.types[1] = type;
  Datum args[2] = {ObjectIdGetDatum(relid), value};
  Datum row[2];
  bool nulls[2];
  read_first_row(shard_of_value, args, owner, row, nulls);
  if (nulls[0])
    elog(ERROR, "get_shard_id_for_distribution_column returned NULL");
  ShardPlacement placement{nulls[1] ? InvalidOid : DatumGetObjectId(row[1]),
                           InvalidOid, false};
  table_owner::Saved saved = table_owner::begin_spi(owner);
  Datum lock_args[2] = {Int32GetDatum(ShareLock), row[0]};
  int rc =
      SPI_execute_plan(kept_plan(lock_metadata), lock_args, nullptr, false, 0);
  if (rc != SPI_OK_SELECT)
    elog(ERROR, "lock_shard_metadata failed: %s", SPI_result_code_string(rc));
  table_owner::finish_spi(saved);
  // Citus takes the lock as an advisory lock, which, unlike a relation's,
  // does not take in the invalidations of the transactions it waited for.
  AcceptInvalidationMessages();
  args[1] = lock_args[1];
  read_first_row(shard_here, args, InvalidOid, row, nulls);
  placement.local_relation = nulls[0] ? InvalidOid : DatumGetObjectId(row[0]);
  placement.placed_here = !nulls[1] && DatumGetBool(row[1]);
  return placement;
}

int32 local_group() {
  Datum row[1];
  bool nulls[1];
  read_first_row(local_group_row, nullptr, InvalidOid, row, nulls);
  return nulls[0] ? -1 : DatumGetInt32(row[0]);
}

List *local_shard_relations(Oid relid) {
  MemoryContext caller = CurrentMemoryContext;
  connect_spi();
  Datum values[1] = {ObjectIdGetDatum(relid)};
  read_now(local_shards, values);
  List *found = NIL;
  MemoryContext spi = MemoryContextSwitchTo(caller);
  for (uint64 i = 0; i < SPI_processed; i++) {
    bool is_null = true;
    found = lappend_oid(
        found, DatumGetObjectId(SPI_getbinval(
                   SPI_tuptable->vals[i], SPI_tuptable->tupdesc, 1, &is_null)));
  }
  MemoryContextSwitchTo(spi);
  SPI_finish();
  return found;
}

} // namespace idempotency::storage::citus
