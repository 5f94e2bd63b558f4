// Expiry of idempotency.keys: LocalKeys::collect_expired and expire_batch
// (storage/keys.hpp), through the index on expires_at.
#include <algorithm>

#include "idempotency/settings/sqlstate_list.hpp"

#include "idempotency/storage/keys.hpp"

#include "idempotency/storage/key_store.hpp"

#include "idempotency/boundary/subtransaction.hpp"

#include "idempotency/compat.hpp"

extern "C" {
#include "access/genam.h"
#include "access/table.h"
#include "access/tableam.h"
#include "catalog/namespace.h"
#include "catalog/pg_am.h"
#include "catalog/pg_opfamily.h"
#include "miscadmin.h"
#include "storage/bufmgr.h"
#include "storage/lmgr.h"
#include "utils/fmgroids.h"
#include "utils/lsyscache.h"
#include "utils/syscache.h"
}

namespace idempotency::storage {

namespace {

// How far a round has come in the expires_at index. A pass goes on after
// the last entry the previous one read, so no pass steps again over keys
// an earlier one handled. Keys may share their expires_at; B-tree keeps
// such equal entries in heap order, so the entry's row address orders them.
struct ExpiryCursor {
  bool positioned;
  TimestampTz expires_at;
  ItemPointerData tid;
};
static_assert(std::is_trivially_destructible_v<ExpiryCursor>);

struct ExpiredKeys {
  ItemPointerData *tids; // sorted in heap order
  int count;
  bool finished; // no expired key left after the cursor
};
static_assert(std::is_trivially_destructible_v<ExpiredKeys>);

// A round's progress in idempotency.keys (ExpiryRound::progress): where
// the index scan stands, and the rows of the current pass.
struct LocalExpiry {
  ExpiryCursor cursor;
  ExpiredKeys pass;
  int next; // pass.tids[next ...] are still to be deleted
};
static_assert(std::is_trivially_destructible_v<LocalExpiry>);

constexpr const char *expires_at_index = "keys_expires_at_idx";
constexpr const char *expiry_opfamily = "expiry_ops";

// A pass collects row addresses only (6 bytes each), so it can go much
// further than a batch; large passes keep a round's scans few.
constexpr int min_keys_per_pass = 100000;

[[noreturn]] void report_missing_index() {
  ereport(ERROR,
          (errcode(ERRCODE_UNDEFINED_OBJECT),
           errmsg("index idempotency.%s on idempotency.keys (expires_at "
                  "idempotency.%s) does not exist",
                  expires_at_index, expiry_opfamily),
           errhint("Recreate it with CREATE INDEX %s ON idempotency.keys "
                   "(expires_at idempotency.%s).",
                   expires_at_index, expiry_opfamily)));
  pg_unreachable();
}

// The index must order expires_at as timestamptz does (the scan keys are
// timestamptz comparisons) in the extension's own family, which the planner
// never uses for a caller's query: an index in the default order would let
// EXPLAIN ANALYZE count other roles' keys by expiry time.
bool orders_by_expiry_family(Relation index, Oid schema) {
  Oid family = GetSysCacheOid3(
      OPFAMILYAMNAMENSP, Anum_pg_opfamily_oid, ObjectIdGetDatum(BTREE_AM_OID),
      CStringGetDatum(expiry_opfamily), ObjectIdGetDatum(schema));
  return OidIsValid(family) && index->rd_opfamily[0] == family;
}

Relation open_expires_at_index(Relation table) {
  Oid index = schema::relation(expires_at_index);
  if (!OidIsValid(index))
    report_missing_index();
  Relation rel = index_open(index, AccessShareLock);
  Form_pg_index form = rel->rd_index;
  if (form->indrelid != table->rd_id ||
      form->indkey.values[0] != key_columns(table).expires_at ||
      rel->rd_rel->relam != BTREE_AM_OID ||
      !orders_by_expiry_family(rel, get_rel_namespace(index)))
    report_missing_index();
  return rel;
}

bool examined_before(const ExpiryCursor &cursor, TimestampTz expires_at,
                     ItemPointer tid) {
  return cursor.positioned && expires_at == cursor.expires_at &&
         ItemPointerCompare(tid, const_cast<ItemPointer>(&cursor.tid)) <= 0;
}

void append(ExpiredKeys *keys, int *capacity, int limit, ItemPointer tid) {
  if (keys->count == *capacity) {
    *capacity = std::min(limit, *capacity * 2);
    keys->tids = static_cast<ItemPointerData *>(
        repalloc(keys->tids, *capacity * sizeof(ItemPointerData)));
  }
  keys->tids[keys->count++] = *tid;
}

// Deletes the row in `slot` unless another transaction is changing it (a
// caller replacing the expired key, or another expiry round): that row is
// not waited for, and a later round looks at it again. No claim is taken: a
// caller that saw the key expired claims it and replaces the row, waiting
// at most for this transaction to end, so expiry never answers a caller
// IK409.
bool delete_unless_busy(Relation table, TupleTableSlot *slot,
                        Snapshot snapshot) {
  TM_FailureData failure;
  TM_Result result = compat::table_tuple_delete(
      table, &slot->tts_tid, GetCurrentCommandId(true), 0 /* options */,
      snapshot, InvalidSnapshot, false /* wait */, &failure);
  return result == TM_Ok;
}

TimestampTz expires_at_of(Relation table, TupleTableSlot *slot) {
  bool isnull = false;
  return DatumGetTimestampTz(
      slot_getattr(slot, key_columns(table).expires_at, &isnull));
}

// The tombstone of the live key in `slot` whose response expired at
// `expires_at`, with its values copied out of the slot, or none (false)
// when the key is not to be remembered past `cutoff`: its window
// (live_row_forgotten_at, the rule callers judge it by) is empty or has
// passed too, or the table has no expired_at (0.7's).
bool tombstone_of(Relation table, TupleTableSlot *slot, TimestampTz expires_at,
                  TimestampTz cutoff, Tombstone *tombstone) {
  const KeyColumns &columns = key_columns(table);
  if (columns.expired_at == InvalidAttrNumber)
    return false;
  bool isnull = false;
  (void)slot_getattr(slot, columns.expired_at, &isnull);
  if (!isnull)
    return false; // a tombstone past its window
  RememberWindow window =
      remember_window(columns, [slot](AttrNumber attnum, bool *null) {
        return slot_getattr(slot, attnum, null);
      });
  TimestampTz forgotten_at = live_row_forgotten_at(window, expires_at);
  if (forgotten_at <= cutoff)
    return false;
  auto copy = [slot](AttrNumber attnum) {
    bool value_isnull = false;
    Datum value = slot_getattr(slot, attnum, &value_isnull);
    return DatumGetByteaPCopy(value);
  };
  tombstone->scope =
      DatumGetObjectId(slot_getattr(slot, columns.scope, &isnull));
  tombstone->digest = copy(columns.key_digest);
  tombstone->request_hash = copy(columns.request_hash);
  tombstone->created_at =
      DatumGetTimestampTz(slot_getattr(slot, columns.created_at, &isnull));
  tombstone->response_expired_at = expires_at;
  tombstone->forgotten_at = forgotten_at;
  return true;
}

} // namespace

bool lock_key_table(LOCKMODE mode) {
  Oid table = schema::relation("keys");
  if (!OidIsValid(table))
    return false;
  LockRelationOid(table, mode);
  // A drop that committed while this waited for the lock took the table.
  return SearchSysCacheExists1(RELOID, ObjectIdGetDatum(table));
}

namespace {

// How many keys one pass collects at most, for a given batch size.
int keys_per_pass(int batch_size) {
  return std::max(batch_size, min_keys_per_pass);
}

// Collects up to `limit` keys with expires_at <= cutoff after the cursor,
// visible to the active snapshot, and moves the cursor on. The result is
// allocated in `result_context`.
ExpiredKeys collect_expired(TimestampTz cutoff, int limit, ExpiryCursor *cursor,
                            MemoryContext result_context) {
  Oid table_oid = key_table().relid;
  Relation table = table_open(table_oid, AccessShareLock);
  Relation index = open_expires_at_index(table);

  ScanKeyData scan_keys[2];
  int nkeys = 0;
  ScanKeyInit(&scan_keys[nkeys++], 1, BTLessEqualStrategyNumber,
              F_TIMESTAMPTZ_LE, TimestampTzGetDatum(cutoff));
  if (cursor->positioned)
    ScanKeyInit(&scan_keys[nkeys++], 1, BTGreaterEqualStrategyNumber,
                F_TIMESTAMPTZ_GE, TimestampTzGetDatum(cursor->expires_at));
  IndexScanDesc scan = compat::index_beginscan(
      table, index, GetActiveSnapshot(), nullptr, nkeys, 0, compat::SO_NONE);
  // The index tuple tells the entries up to the cursor apart without a
  // visit to the heap.
  scan->xs_want_itup = true;
  index_rescan(scan, scan_keys, nkeys, nullptr, 0);
  TupleTableSlot *slot = table_slot_create(table, nullptr);

  int capacity = std::min(limit, 1024);
  ExpiredKeys keys{static_cast<ItemPointerData *>(MemoryContextAlloc(
                       result_context, capacity * sizeof(ItemPointerData))),
                   0, true};
  ItemPointer tid;
  while ((tid = index_getnext_tid(scan, ForwardScanDirection)) != nullptr) {
    CHECK_FOR_INTERRUPTS();
    bool isnull = false;
    TimestampTz expires_at = DatumGetTimestampTz(
        index_getattr(scan->xs_itup, 1, scan->xs_itupdesc, &isnull));
    if (examined_before(*cursor, expires_at, tid))
      continue;
    if (keys.count == limit) {
      keys.finished = false;
      break;
    }
    cursor->positioned = true;
    cursor->expires_at = expires_at;
    cursor->tid = *tid;
    if (index_fetch_heap(scan, slot))
      append(&keys, &capacity, limit, &slot->tts_tid);
  }

  ExecDropSingleTupleTableSlot(slot);
  index_endscan(scan);
  index_close(index, NoLock);
  table_close(table, NoLock);

  // Deleting in heap order dirties each page once per batch.
  std::sort(keys.tids, keys.tids + keys.count,
            [](const ItemPointerData &a, const ItemPointerData &b) {
              return ItemPointerCompare(const_cast<ItemPointer>(&a),
                                        const_cast<ItemPointer>(&b)) < 0;
            });
  return keys;
}

// Deletes, in the current transaction with the active snapshot, those of
// the rows `tids` that are still expired and that no other transaction is
// changing; returns how many it deleted. A live key's row whose window under
// idempotency.remember has not passed by `cutoff` is replaced by its
// tombstone (storage/keys.hpp, write_tombstone); a tombstone past its window,
// or a key not remembered, is deleted.
int64 delete_expired(TimestampTz cutoff, const ItemPointerData *tids,
                     int count) {
  Relation table = table_open(key_table().relid, RowExclusiveLock);
  Snapshot snapshot = GetActiveSnapshot();
  TupleTableSlot *slot = table_slot_create(table, nullptr);
  // Rows collected earlier may be gone with their pages: VACUUM may have
  // truncated the table before this transaction locked it.
  BlockNumber blocks = RelationGetNumberOfBlocks(table);

  int64 deleted = 0;
  bool writing_tombstones = false;
  TombstoneWriter tombstones{};
  for (int i = 0; i < count; i++) {
    CHECK_FOR_INTERRUPTS();
    ItemPointerData tid = tids[i];
    if (ItemPointerGetBlockNumber(&tid) >= blocks ||
        !table_tuple_fetch_row_version(table, &tid, snapshot, slot))
      continue;
    // Replaced by a caller, or a new row in a reused slot: not expired.
    TimestampTz expires_at = expires_at_of(table, slot);
    if (expires_at > cutoff)
      continue;
    Tombstone tombstone{};
    bool remembered = tombstone_of(table, slot, expires_at, cutoff, &tombstone);
    bool deleted_row = delete_unless_busy(table, slot, snapshot);
    if (deleted_row)
      deleted++;
    if (!remembered)
      continue;
    if (deleted_row) {
      if (!writing_tombstones) {
        tombstones = begin_tombstones(table);
        writing_tombstones = true;
      }
      write_tombstone(tombstones, table, tombstone);
    }
    pfree(tombstone.digest);
    pfree(tombstone.request_hash);
  }
  if (writing_tombstones)
    end_tombstones(tombstones);

  ExecDropSingleTupleTableSlot(slot);
  table_close(table, NoLock);
  return deleted;
}

// An error writing a row's tombstone is the row's (a DBA's constraint,
// index or trigger refused it) unless it is a transient condition (a lock
// timeout, a cancel, ...), which ends the batch and the round.
bool refused_row(const ErrorData *error) {
  return !sqlstate_transient(unpack_sql_state(error->sqlerrcode));
}

void note_kept_row(ExpiryRound &round, const ErrorData *error) {
  if (round.kept++ > 0)
    return;
  MemoryContext caller = MemoryContextSwitchTo(round.context);
  round.kept_reason =
      psprintf("%s: %s", unpack_sql_state(error->sqlerrcode), error->message);
  MemoryContextSwitchTo(caller);
}

// The rows of a batch that failed, each in a subtransaction of its own: a
// row whose tombstone is refused keeps its live row (deleting it would let
// a late retry run again); callers judge it by its times all the same, and
// once its window has passed it is deleted without a tombstone.
int64 expire_row_by_row(ExpiryRound &round, const ItemPointerData *tids,
                        int count) {
  int64 deleted = 0;
  for (int i = 0; i < count; i++) {
    const ItemPointerData *tid = &tids[i];
    int64 row_deleted = 0;
    if (run_in_subtransaction(
            [&] { row_deleted = delete_expired(round.cutoff, tid, 1); },
            [&](const ErrorData *error) {
              if (!refused_row(error))
                return false;
              note_kept_row(round, error);
              return true;
            }))
      deleted += row_deleted;
  }
  return deleted;
}

LocalExpiry &progress_of(ExpiryRound &round) {
  if (round.progress == nullptr)
    round.progress = MemoryContextAllocZero(round.context, sizeof(LocalExpiry));
  return *static_cast<LocalExpiry *>(round.progress);
}

} // namespace

void LocalKeys::collect_expired(ExpiryRound &round, int batch_size) const {
  LocalExpiry &expiry = progress_of(round);
  if (expiry.pass.tids != nullptr)
    pfree(expiry.pass.tids);
  expiry.pass = storage::collect_expired(
      round.cutoff, keys_per_pass(batch_size), &expiry.cursor, round.context);
  expiry.next = 0;
  round.has_batch = expiry.pass.count > 0;
  round.finished = expiry.pass.finished;
  round.paced = true;
}

ExpiryBatch LocalKeys::expire_batch(ExpiryRound &round, int batch_size) const {
  LocalExpiry &expiry = progress_of(round);
  int count = std::min(batch_size, expiry.pass.count - expiry.next);
  const ItemPointerData *tids = expiry.pass.tids + expiry.next;
  TimestampTz cutoff = round.cutoff;
  int64 deleted = 0;
  // One subtransaction for the batch, and one per row only when it failed.
  if (!run_in_subtransaction(
          [&] { deleted = delete_expired(cutoff, tids, count); }, refused_row))
    deleted = expire_row_by_row(round, tids, count);
  expiry.next += count;
  round.has_batch = expiry.next < expiry.pass.count;
  return ExpiryBatch{deleted, count};
}

} // namespace idempotency::storage
