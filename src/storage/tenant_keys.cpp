#include "idempotency/storage/tenant_keys.hpp"

#include "idempotency/storage/citus.hpp"
#include "idempotency/storage/role_marks.hpp"

#include "idempotency/boundary/sqlstates.hpp"

#include "idempotency/settings/settings.hpp"

extern "C" {
#include "catalog/namespace.h"
#include "executor/spi.h"
#include "miscadmin.h"
#include "storage/lmgr.h"
#include "storage/proc.h"
#include "utils/builtins.h"
#include "utils/datum.h"
#include "utils/lsyscache.h"
#include "utils/syscache.h"
}

namespace idempotency::storage::tenant_keys {

namespace {

constexpr const char *table_name = "tenant_keys";

Oid tenant_keys_oid() {
  Oid schema = get_namespace_oid("idempotency", true);
  return OidIsValid(schema) ? get_relname_relid(table_name, schema)
                            : InvalidOid;
}

Oid table_owner(Oid relid) {
  HeapTuple tuple = SearchSysCache1(RELOID, ObjectIdGetDatum(relid));
  if (!HeapTupleIsValid(tuple))
    elog(ERROR, "cache lookup failed for relation %u", relid);
  Oid owner = ((Form_pg_class)GETSTRUCT(tuple))->relowner;
  ReleaseSysCache(tuple);
  return owner;
}

// The statements of this file, each run through SPI as the table's owner
// (callers have no rights on the table; a BEFORE trigger or default a DBA
// added runs as that owner, as it would for the extension's own writes).
// Every name is schema-qualified, every operator too: the caller's
// search_path plays no part.
// A statement's plan, kept for the backend's life (see OwnerSpi::run_kept).
struct KeptPlan {
  Oid tenant_type;
  SPIPlanPtr plan;
};
static_assert(std::is_trivially_destructible_v<KeptPlan>);

KeptPlan insert_plan;

// Whether `kept` is to be prepared (again) before it runs for a tenant of
// type `tenant_type`.
bool needs_preparing(const KeptPlan &kept, Oid tenant_type) {
  return kept.plan == nullptr || kept.tenant_type != tenant_type;
}

class OwnerSpi {
public:
  explicit OwnerSpi(Oid owner) {
    caller_context_ = CurrentMemoryContext;
    GetUserIdAndSecContext(&saved_user_, &saved_context_);
    SetUserIdAndSecContext(owner,
                           saved_context_ | SECURITY_LOCAL_USERID_CHANGE);
    if (SPI_connect() != SPI_OK_CONNECT)
      elog(ERROR, "SPI_connect failed");
  }
  // Not a destructor: frames that call PostgreSQL hold only trivially
  // destructible values. On an error, the (sub)transaction's abort restores
  // the user and closes SPI.
  void finish() {
    SPI_finish();
    SetUserIdAndSecContext(saved_user_, saved_context_);
  }
  int run(const char *sql, int nargs, Oid *types, Datum *values,
          const char *nulls, bool read_only, int expected) {
    int rc =
        SPI_execute_with_args(sql, nargs, types, values, nulls, read_only, 0);
    if (rc != expected)
      elog(ERROR, "idempotency.tenant_keys: statement failed: %s",
           SPI_result_code_string(rc));
    return rc;
  }
  // The same through a plan kept for the backend's life: the statements of
  // every call are parsed and planned (by Citus too) once, not per call.
  // PostgreSQL's plan cache replans them when the table changes; a plan
  // made for another tenant type is made again.
  int run_kept(KeptPlan &kept, const char *sql, int nargs, Oid *types,
               Datum *values, const char *nulls, bool read_only, int expected) {
    if (needs_preparing(kept, types[0])) {
      if (kept.plan != nullptr)
        SPI_freeplan(kept.plan);
      kept.plan = nullptr;
      // A generic plan: Citus then keeps the local plan of the shard query
      // with it, instead of deparsing, parsing and planning the shard query
      // again on every execution (as it does for a custom plan).
      SPIPlanPtr plan =
          SPI_prepare_cursor(sql, nargs, types, CURSOR_OPT_GENERIC_PLAN);
      if (plan == nullptr)
        elog(ERROR, "idempotency.tenant_keys: preparing failed: %s",
             SPI_result_code_string(SPI_result));
      if (SPI_keepplan(plan) != 0)
        elog(ERROR, "idempotency.tenant_keys: SPI_keepplan failed");
      kept.plan = plan;
      kept.tenant_type = types[0];
    }
    int rc = SPI_execute_plan(kept.plan, values, nulls, read_only, 0);
    if (rc != expected)
      elog(ERROR, "idempotency.tenant_keys: statement failed: %s",
           SPI_result_code_string(rc));
    return rc;
  }
  MemoryContext caller_context() const { return caller_context_; }

private:
  MemoryContext caller_context_;
  Oid saved_user_;
  int saved_context_;
};
static_assert(std::is_trivially_destructible_v<OwnerSpi>);

// The key's identity, as the statements' first three parameters.
constexpr int identity_args = 3;
constexpr const char *identity_filter =
    "k.tenant OPERATOR(pg_catalog.=) $1"
    " AND k.scope OPERATOR(idempotency.=)"
    " $2::pg_catalog.regrole::idempotency.role_scope"
    " AND k.key_digest OPERATOR(pg_catalog.=) $3";

void set_identity(const KeyRef &key, Oid *types, Datum *values) {
  types[0] = key.tenant_type;
  values[0] = key.tenant;
  types[1] = REGROLEOID;
  values[1] = ObjectIdGetDatum(key.scope);
  types[2] = BYTEAOID;
  values[2] = PointerGetDatum(key.digest);
}

Oid tenant_column_type(Oid relid) {
  AttrNumber attnum = get_attnum(relid, "tenant");
  if (attnum == InvalidAttrNumber)
    ereport(ERROR,
            (errcode(ERRCODE_UNDEFINED_COLUMN),
             errmsg("idempotency.tenant_keys has no column \"tenant\"")));
  return get_atttype(relid, attnum);
}

void check_tenant_type(Oid relid, const KeyRef &key) {
  Oid column_type = tenant_column_type(relid);
  if (column_type == key.tenant_type)
    return;
  ereport(ERROR,
          (errcode(ERRCODE_DATATYPE_MISMATCH),
           errmsg("tenant is of type %s, but idempotency.tenant_keys.tenant "
                  "is of type %s",
                  format_type_be(key.tenant_type), format_type_be(column_type)),
           errhint("Pass the tenant as %s, the type of the distribution "
                   "column the keys are co-located with.",
                   format_type_be(column_type))));
}

// The tenant's shard of idempotency.tenant_keys, found through Citus's
// metadata.
uint64 shard_of(Oid relid, Oid owner, const KeyRef &key) {
  // As the table's owner: Citus checks that its caller may read the table,
  // and callers have no rights on it.
  Oid saved_user;
  int saved_context;
  GetUserIdAndSecContext(&saved_user, &saved_context);
  SetUserIdAndSecContext(owner, saved_context | SECURITY_LOCAL_USERID_CHANGE);
  uint64 shard = citus::shard_for_value(relid, key.tenant_type, key.tenant);
  SetUserIdAndSecContext(saved_user, saved_context);
  return shard;
}

// The shard's relation on this node, InvalidOid when there is none. Citus
// names a shard after its table and shard id, in the table's schema
// ("tenant_keys_102008": short enough that Citus never shortens it).
Oid shard_relation(Oid relid, uint64 shard) {
  char name[NAMEDATALEN];
  snprintf(name, sizeof name, "%s_" UINT64_FORMAT, table_name, shard);
  return get_relname_relid(name, get_rel_namespace(relid));
}

// The last placement table_for() checked, and where: while the transaction
// is still in the subtransaction that checked it, the placement lock taken
// before the check is held (a lock goes only when the (sub)transaction that
// took it ends), so no move can have ended since, and store() need not
// check again. A lock taken in a subtransaction that rolled back is gone;
// a request then looks again.
struct CheckedPlacement {
  LocalTransactionId transaction;
  SubTransactionId subtransaction;
  Oid local_shard;
  // The shard has copies on other nodes too (a replicated table), which
  // only Citus's executor writes together.
  bool replicated;
};
static_assert(std::is_trivially_destructible_v<CheckedPlacement>);
CheckedPlacement checked_placement{InvalidLocalTransactionId,
                                   InvalidSubTransactionId, InvalidOid, false};

void remember_checked(Oid local_shard, bool replicated) {
  checked_placement = CheckedPlacement{
      MyProc->lxid, GetCurrentSubTransactionId(), local_shard, replicated};
}

bool placement_still_checked(Oid local_shard) {
  return checked_placement.transaction == MyProc->lxid &&
         checked_placement.subtransaction == GetCurrentSubTransactionId() &&
         checked_placement.local_shard == local_shard;
}

// Kept plans of the statements on a local shard relation (the probe and the
// insert), one set per shard (a node holds a few dozen shards of the
// table); when all slots are taken, the next shard takes a slot over in
// turn.
constexpr int shard_plan_slots = 64;
struct ShardPlans {
  Oid shard;
  KeptPlan probe;
  KeptPlan insert;
};
static_assert(std::is_trivially_destructible_v<ShardPlans>);
ShardPlans shard_plans[shard_plan_slots];
int next_shard_slot = 0;

// A plan names the shard it was made for: once that shard is dropped (moved
// away), its OID may come back as another shard's. Made again by name.
void forget_if_invalid(KeptPlan &kept) {
  if (kept.plan != nullptr && !SPI_plan_is_valid(kept.plan)) {
    SPI_freeplan(kept.plan);
    kept.plan = nullptr;
  }
}

ShardPlans &plans_for(Oid shard) {
  for (ShardPlans &slot : shard_plans) {
    if (slot.shard != shard)
      continue;
    forget_if_invalid(slot.probe);
    forget_if_invalid(slot.insert);
    return slot;
  }
  ShardPlans &slot = shard_plans[next_shard_slot];
  next_shard_slot = (next_shard_slot + 1) % shard_plan_slots;
  if (slot.probe.plan != nullptr)
    SPI_freeplan(slot.probe.plan);
  if (slot.insert.plan != nullptr)
    SPI_freeplan(slot.insert.plan);
  slot = ShardPlans{shard, KeptPlan{InvalidOid, nullptr},
                    KeptPlan{InvalidOid, nullptr}};
  return slot;
}

const char *shard_name_of(Oid shard) {
  return quote_qualified_identifier(
      get_namespace_name(get_rel_namespace(shard)), get_rel_name(shard));
}

const char *tenant_text(const KeyRef &key) {
  Oid output;
  bool is_varlena;
  getTypeOutputInfo(key.tenant_type, &output, &is_varlena);
  return OidOutputFunctionCall(output, key.tenant);
}

pg_attribute_noreturn() void report_not_local(const KeyRef &key) {
  const char *tenant = tenant_text(key);
  ereport(
      ERROR,
      (errcode(ERRCODE_FEATURE_NOT_SUPPORTED),
       errmsg("the idempotency keys of tenant %s are on another node", tenant),
       errdetail("A tenant's keys are read and written only on the node that "
                 "holds its shard of idempotency.tenant_keys, in the same "
                 "local transaction as the request's own work."),
       errhint("Call the tenant_* functions inside a function distributed "
               "with create_distributed_function(..., colocate_with => "
               "'idempotency.tenant_keys', force_delegation => true), whose "
               "distribution argument is this tenant: Citus runs it on that "
               "node. See the extension's docs/scale-out.md.")));
  pg_unreachable();
}

// 40001: the request met a shard move of its tenant. Nothing of it is kept
// (the transaction aborts), and its retry is routed by Citus's metadata as
// the move left it.
pg_attribute_noreturn() void report_moved(const KeyRef &key) {
  ereport(ERROR,
          (errcode(ERRCODE_T_R_SERIALIZATION_FAILURE),
           errmsg("the shard of tenant %s moved between nodes during the "
                  "request",
                  tenant_text(key)),
           errdetail("Citus moved the tenant's shards between the moment it "
                     "sent the request to this node and the moment the "
                     "request reached the tenant's keys; nothing of the "
                     "request is kept."),
           errhint("Retry the request: Citus sends it to the node that holds "
                   "the tenant now.")));
  pg_unreachable();
}

Datum copy_to(MemoryContext context, Datum value, bool by_value, int length) {
  MemoryContext saved = MemoryContextSwitchTo(context);
  Datum copy = datumCopy(value, by_value, length);
  MemoryContextSwitchTo(saved);
  return copy;
}

// The key's row, written into the tenant's shard on this node as Citus's
// local executor writes it (an INSERT on the shard relation, which fires
// the shard's triggers and checks its constraints), through a plan kept
// per shard: Citus would deparse, parse and plan that INSERT again on every
// call. Where Citus would not write this node's shard from this backend
// (citus::may_write_local_shard), or the shard has copies on other nodes,
// the INSERT goes through Citus instead. Parameters as set by store(), which
// has checked the placement (checked_placement); leaves the row's times in
// SPI_tuptable.
void insert_row(OwnerSpi &spi, const KeyTable &table, Oid *types, Datum *values,
                const char *nulls) {
  constexpr const char *columns =
      "(tenant, scope, key, key_digest, request_hash, response, created_at,"
      " expires_at) VALUES ($1,"
      " $2::pg_catalog.regrole::idempotency.role_scope, $4, $3, $5, $6, $7,"
      " $8) RETURNING k.created_at, k.expires_at";
  constexpr int nargs = 8;
  if (checked_placement.replicated || !citus::may_write_local_shard()) {
    char sql[512];
    snprintf(sql, sizeof sql, "INSERT INTO idempotency.tenant_keys AS k %s",
             columns);
    spi.run_kept(insert_plan, sql, nargs, types, values, nulls, false,
                 SPI_OK_INSERT_RETURNING);
    return;
  }
  KeptPlan &kept = plans_for(table.local_shard).insert;
  char sql[640] = "";
  if (needs_preparing(kept, types[0]))
    snprintf(sql, sizeof sql, "INSERT INTO %s AS k %s",
             shard_name_of(table.local_shard), columns);
  citus::note_local_shard_write();
  spi.run_kept(kept, sql, nargs, types, values, nulls, false,
               SPI_OK_INSERT_RETURNING);
}

} // namespace

// Citus's lock on the placement metadata of the tenant's shard, in share
// mode, until the transaction ends (citus::lock_shard_placement): the lock
// Citus's own writes to the shard take, and that a shard move
// (citus_move_shard_placement, the rebalancer) takes in exclusive mode, on
// every node, for the last moment of the move, in which its logical
// replication catches up with the writes made to the old placement and it
// changes the placement. For a hash-distributed table Citus locks the group
// of co-located shards (the tenant's shards of every table co-located with
// the keys) as one, so this lock and those fn's writes take are the same
// lock: no order between them to deadlock on. Taken before the placement is
// checked, it keeps the placement checked for the whole request: a move
// waits for the request to end (and then carries the key it wrote to the
// new placement), and a request that comes while a move holds the lock
// waits for the move and then sees where it put the shard. Without it, a
// move could end between the check and the request's writes, which would
// then land in a placement the move has already left behind.
KeyTable table_for(const KeyRef &key) {
  Oid relid = tenant_keys_oid();
  if (!OidIsValid(relid))
    ereport(ERROR,
            (errcode(ERRCODE_UNDEFINED_TABLE),
             errmsg("table idempotency.tenant_keys does not exist"),
             errhint("A superuser creates it on the Citus coordinator with "
                     "SELECT idempotency.distribute_keys('table'), naming a "
                     "distributed table the keys are to be co-located with.")));
  if (citus::table_kind(relid) != citus::TableKind::distributed)
    ereport(ERROR,
            (errcode(ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE),
             errmsg("idempotency.tenant_keys is not a Citus distributed table"),
             errhint("Create it with idempotency.distribute_keys().")));
  check_tenant_type(relid, key);
  Oid owner = table_owner(relid);
  uint64 shard = shard_of(relid, owner, key);
  // Whether a relation of the shard was on this node before the lock was
  // taken: a request that waited for a move that took the shard away still
  // knows it was sent here for it, should Citus drop the old placement
  // before the request looks again.
  bool was_here = OidIsValid(shard_relation(relid, shard));
  citus::lock_shard_placement(shard);
  Oid local_shard = shard_relation(relid, shard);
  citus::ShardPlacements placed = citus::shard_placements(shard);
  if (OidIsValid(local_shard) && placed.here) {
    remember_checked(local_shard, placed.count > 1);
    return KeyTable{relid, local_shard, owner};
  }
  // A relation of the shard here, placed elsewhere: Citus is moving the
  // shard here (before the new placement is visible), or moved it away
  // after it sent this request here (the old placement is dropped later).
  // Either way the request was on its way during a move, and its retry
  // goes where the move put the shard.
  if (was_here || OidIsValid(local_shard))
    report_moved(key);
  report_not_local(key);
}

const Backend backend{};

KeyProbe Backend::probe(const KeyTable &table, const KeyRef &key,
                        TimestampTz now) const {
  Oid types[identity_args];
  Datum values[identity_args];
  set_identity(key, types, values);
  // The tenant's shard on this node is read directly, as a local table:
  // through Citus, the same lookup costs several times as much (it plans
  // the shard query anew on every call). table_for() holds the placement
  // lock: the shard stays here until the transaction ends.
  KeptPlan &kept = plans_for(table.local_shard).probe;
  char sql[640] = "";
  if (needs_preparing(kept, key.tenant_type))
    snprintf(sql, sizeof sql,
             "SELECT k.key, k.request_hash, k.response, k.created_at,"
             " k.expires_at FROM %s AS k WHERE %s",
             shard_name_of(table.local_shard), identity_filter);

  OwnerSpi spi(table.owner);
  spi.run_kept(kept, sql, identity_args, types, values, nullptr, false,
               SPI_OK_SELECT);
  KeyProbe result{};
  result.state = KeyState::absent;
  result.response_is_null = true;
  if (SPI_processed > 0) {
    HeapTuple row = SPI_tuptable->vals[0];
    TupleDesc desc = SPI_tuptable->tupdesc;
    bool is_null = false;
    text *stored_key = DatumGetTextPP(SPI_getbinval(row, desc, 1, &is_null));
    if (VARSIZE_ANY_EXHDR(stored_key) != VARSIZE_ANY_EXHDR(key.key) ||
        memcmp(VARDATA_ANY(stored_key), VARDATA_ANY(key.key),
               VARSIZE_ANY_EXHDR(key.key)) != 0)
      report_shared_digest();
    result.created_at =
        DatumGetTimestampTz(SPI_getbinval(row, desc, 4, &is_null));
    result.expires_at =
        DatumGetTimestampTz(SPI_getbinval(row, desc, 5, &is_null));
    if (result.expires_at <= now) {
      result.state = KeyState::expired;
    } else {
      result.state = KeyState::done;
      MemoryContext caller = spi.caller_context();
      result.request_hash = DatumGetByteaPP(
          copy_to(caller, SPI_getbinval(row, desc, 2, &is_null), false, -1));
      Datum response = SPI_getbinval(row, desc, 3, &result.response_is_null);
      if (!result.response_is_null)
        result.response = copy_to(caller, response, false, -1);
    }
  }
  spi.finish();
  return result;
}

StoredRow Backend::store(const KeyTable &table, const KeyRef &key,
                         const NewRow &row) const {
  TimestampTz created_at = GetCurrentTimestamp();
  TimestampTz expires_at = settings::key_expiry(created_at, row.ttl);

  constexpr int nargs = identity_args + 5;
  Oid types[nargs];
  Datum values[nargs];
  char nulls[nargs + 1];
  memset(nulls, ' ', nargs);
  nulls[nargs] = '\0';
  set_identity(key, types, values);
  types[3] = TEXTOID;
  values[3] = PointerGetDatum(key.key);
  types[4] = BYTEAOID;
  values[4] = PointerGetDatum(row.request_hash);
  types[5] = JSONBOID;
  values[5] = row.response;
  if (row.response_is_null)
    nulls[5] = 'n';
  types[6] = TIMESTAMPTZOID;
  values[6] = TimestampTzGetDatum(created_at);
  types[7] = TIMESTAMPTZOID;
  values[7] = TimestampTzGetDatum(expires_at);

  // The role's mark on this node (see role_marks.hpp), under the lock the
  // insert takes anyway: a DROP OWNED running here has committed, and this
  // backend forgot its marks, or it waits for this transaction.
  LockRelationOid(table.relid, RowExclusiveLock);
  role_marks::ensure_tenant(table.relid, key.scope);

  OwnerSpi spi(table.owner);
  if (row.replaces != nullptr) {
    char sql[512];
    snprintf(sql, sizeof sql,
             "DELETE FROM idempotency.tenant_keys AS k WHERE %s"
             " AND k.expires_at OPERATOR(pg_catalog.<=) $7",
             identity_filter);
    Oid delete_types[7] = {types[0], types[1], types[2], types[3],
                           types[4], types[5], types[6]};
    // $4..$6 are unused by the DELETE; passing them keeps $7 in place.
    spi.run(sql, 7, delete_types, values, nulls, false, SPI_OK_DELETE);
  }

  // table_for() took the placement lock and then checked the placement; a
  // lock taken in a subtransaction that rolled back is gone, and a request
  // then checks again (a key sent to the tenant's new node would go through
  // another connection than fn's writes).
  KeyTable checked =
      placement_still_checked(table.local_shard) ? table : table_for(key);

  MemoryContext caller = spi.caller_context();
  PG_TRY();
  { insert_row(spi, checked, types, values, nulls); }
  PG_CATCH();
  {
    // Another transaction stored the key first: the primary key refused
    // this one. The transaction is aborting; say what it means.
    MemoryContextSwitchTo(caller);
    ErrorData *error = CopyErrorData();
    if (error->sqlerrcode != ERRCODE_UNIQUE_VIOLATION)
      PG_RE_THROW();
    FlushErrorState();
    ereport(ERROR,
            (errcode(errcode_key_in_progress),
             errmsg("idempotency key was stored by another transaction first"),
             errdetail("Another transaction claimed the key on another node "
                       "(the tenant's shard was moving) and committed it."),
             errhint("Retry the request: it replays the stored response.")));
  }
  PG_END_TRY();
  // A BEFORE trigger may change the row, but not drop it: a retry of the
  // key would run its request again.
  if (SPI_processed == 0)
    ereport(ERROR,
            (errcode(ERRCODE_TRIGGERED_ACTION_EXCEPTION),
             errmsg("a BEFORE INSERT trigger on idempotency.tenant_keys "
                    "skipped the row of idempotency key \"%s\"",
                    text_to_cstring(key.key)),
             errdetail("Without its row, a retry of the key would run its "
                       "request again.")));
  StoredRow stored{};
  bool is_null = false;
  stored.created_at = DatumGetTimestampTz(
      SPI_getbinval(SPI_tuptable->vals[0], SPI_tuptable->tupdesc, 1, &is_null));
  stored.expires_at = DatumGetTimestampTz(
      SPI_getbinval(SPI_tuptable->vals[0], SPI_tuptable->tupdesc, 2, &is_null));
  spi.finish();
  return stored;
}

bool Backend::remove(const KeyTable &table, const KeyRef &key,
                     const KeyProbe &) const {
  Oid types[identity_args + 1];
  Datum values[identity_args + 1];
  set_identity(key, types, values);
  types[3] = TEXTOID;
  values[3] = PointerGetDatum(key.key);
  char sql[512];
  snprintf(sql, sizeof sql,
           "DELETE FROM idempotency.tenant_keys AS k WHERE %s"
           " AND k.key OPERATOR(pg_catalog.=) $4",
           identity_filter);
  OwnerSpi spi(table.owner);
  spi.run(sql, identity_args + 1, types, values, nullptr, false, SPI_OK_DELETE);
  bool removed = SPI_processed > 0;
  spi.finish();
  return removed;
}

namespace {

// Deletes the tenant keys expired at `now`; returns how many.
int64 expire(TimestampTz now) {
  Oid relid = tenant_keys_oid();
  if (!OidIsValid(relid) ||
      citus::table_kind(relid) != citus::TableKind::distributed)
    return 0;
  OwnerSpi spi(table_owner(relid));
  spi.run("SELECT g.groupid FROM pg_catalog.pg_dist_local_group AS g", 0,
          nullptr, nullptr, nullptr, true, SPI_OK_SELECT);
  bool is_null = true;
  bool coordinator =
      SPI_processed > 0 &&
      DatumGetInt32(SPI_getbinval(SPI_tuptable->vals[0], SPI_tuptable->tupdesc,
                                  1, &is_null)) == 0 &&
      !is_null;
  int64 deleted = 0;
  if (coordinator) {
    Oid types[1] = {TIMESTAMPTZOID};
    Datum values[1] = {TimestampTzGetDatum(now)};
    spi.run("DELETE FROM idempotency.tenant_keys AS k"
            " WHERE k.expires_at OPERATOR(pg_catalog.<=) $1",
            1, types, values, nullptr, false, SPI_OK_DELETE);
    deleted = (int64)SPI_processed;
  }
  spi.finish();
  return deleted;
}

} // namespace

// Nothing to collect: Citus finds the expired keys on every shard, in one
// statement that each shard runs on its own, which expire_rate does not
// pace.
void Backend::collect_expired(ExpiryRound &round, int) const {
  round.has_batch = true;
  round.finished = true;
  round.paced = false;
}

ExpiryBatch Backend::expire_batch(ExpiryRound &round, int) const {
  int64 deleted = expire(round.cutoff);
  round.has_batch = false;
  return ExpiryBatch{deleted, deleted};
}

} // namespace idempotency::storage::tenant_keys
