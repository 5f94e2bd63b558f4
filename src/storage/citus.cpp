#include "idempotency/storage/citus.hpp"

extern "C" {
#include "access/genam.h"
#include "access/table.h"
#include "access/xact.h"
#include "catalog/pg_namespace.h"
#include "miscadmin.h"
#include "utils/fmgroids.h"
#include "utils/guc.h"
#include "utils/lsyscache.h"
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

// Looks Citus's functions up once per backend. load_external_function
// finds the library among those already loaded (same name, same file), so
// it never loads Citus here - which, outside shared_preload_libraries,
// Citus would refuse with an error.
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
      load_external_function(entry, "InCoordinatedTransaction", true, nullptr));
  found.use_two_phase_commit =
      reinterpret_cast<Use2PCForCoordinatedTransaction>(load_external_function(
          entry, "Use2PCForCoordinatedTransaction", true, nullptr));
  manager = found;
  presence = Presence::present;
  return true;
}

void use_two_phase_commit_if_coordinated() {
  if (manager.in_coordinated_transaction())
    manager.use_two_phase_commit();
}

// Remote work may come after the key is written - claim() and complete()
// followed by an UPDATE of a distributed table, or deferred triggers - so
// the decision is made again when the transaction commits.
//
// Order at PRE_COMMIT: deferred triggers have fired by then (they fire
// before the callbacks), and this callback must run before Citus's own,
// which prepares or commits the remote transactions. PostgreSQL calls
// transaction callbacks newest first. Citus registers its callback in its
// _PG_init, in the postmaster: it can only be preloaded, and it refuses to
// load after another library has set ProcessUtility_hook, which this
// extension's _PG_init does, so Citus always comes first in
// shared_preload_libraries. This callback is registered later, in the
// backend, at the first write of a key - so it is newer and runs first.
void on_transaction_event(XactEvent event, void *) {
  switch (event) {
  case XACT_EVENT_PRE_COMMIT:
    if (wrote_keys)
      use_two_phase_commit_if_coordinated();
    break;
  case XACT_EVENT_COMMIT:
  case XACT_EVENT_ABORT:
  case XACT_EVENT_PREPARE:
  case XACT_EVENT_PARALLEL_COMMIT:
  case XACT_EVENT_PARALLEL_ABORT:
    wrote_keys = false;
    break;
  default:
    // PRE_PREPARE: Citus refuses PREPARE TRANSACTION in a coordinated
    // transaction itself.
    break;
  }
}

} // namespace

void note_key_write() {
  if (!citus_loaded())
    return;
  static bool registered = false;
  if (!registered) {
    RegisterXactCallback(on_transaction_event, nullptr);
    registered = true;
  }
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
  for (int i = 0; i < desc->natts; i++) {
    Form_pg_attribute attribute = TupleDescAttr(desc, i);
    if (!attribute->attisdropped &&
        strcmp(NameStr(attribute->attname), name) == 0)
      return attribute->attnum;
  }
  return InvalidAttrNumber;
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

} // namespace idempotency::storage::citus
