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
#include "storage/lmgr.h"
#include "utils/fmgroids.h"
#include "utils/lsyscache.h"
#include "utils/snapmgr.h"
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

// The tombstone of the deleted row `row` (delete_expired_rows' columns),
// or none (false) when the key is not to be remembered past `cutoff`: its
// window (live_row_forgotten_at, the rule callers judge it by) is empty or
// has passed too, the row was a tombstone past its window, or the table has
// no expired_at (0.7's).
bool tombstone_of(const KeyColumns &columns, HeapTuple row, TupleDesc desc,
                  TimestampTz cutoff, Tombstone *tombstone) {
  if (columns.expired_at == InvalidAttrNumber)
    return false;
  enum { scope = 1, digest, hash, created_at, expires_at, expired_at, window };
  bool isnull = false;
  (void)SPI_getbinval(row, desc, expired_at, &isnull);
  if (!isnull)
    return false; // a tombstone past its window
  TimestampTz response_expired_at =
      DatumGetTimestampTz(SPI_getbinval(row, desc, expires_at, &isnull));
  RememberWindow remembered =
      remember_window(columns, [&](AttrNumber, bool *null) {
        return SPI_getbinval(row, desc, window, null);
      });
  TimestampTz forgotten_at =
      live_row_forgotten_at(remembered, response_expired_at);
  if (forgotten_at <= cutoff)
    return false;
  tombstone->scope = DatumGetObjectId(SPI_getbinval(row, desc, scope, &isnull));
  tombstone->digest =
      DatumGetByteaPP(SPI_getbinval(row, desc, digest, &isnull));
  tombstone->request_hash =
      DatumGetByteaPP(SPI_getbinval(row, desc, hash, &isnull));
  tombstone->created_at =
      DatumGetTimestampTz(SPI_getbinval(row, desc, created_at, &isnull));
  tombstone->response_expired_at = response_expired_at;
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

// Deletes, in the current transaction, those of the rows `tids` that are
// still expired and that no other transaction is changing; returns how many
// it deleted. A live key's row whose window under idempotency.remember has
// not passed by `cutoff` is replaced by its tombstone (storage/keys.hpp,
// insert_tombstones); a tombstone past its window, or a key not remembered,
// is deleted.
int64 delete_expired(TimestampTz cutoff, const ItemPointerData *tids,
                     int count) {
  Relation table = table_open(key_table().relid, RowExclusiveLock);
  const KeyColumns &columns = key_columns(table);
  table_close(table, NoLock);
  OwnerSpi spi = begin_key_statements();
  uint64 deleted = delete_expired_rows(spi, tids, count, cutoff);
  SPITupleTable *rows = SPI_tuptable;
  auto *tombstones =
      static_cast<Tombstone *>(palloc(Max(deleted, 1) * sizeof(Tombstone)));
  int remembered = 0;
  for (uint64 i = 0; i < deleted; i++)
    if (tombstone_of(columns, rows->vals[i], rows->tupdesc, cutoff,
                     &tombstones[remembered]))
      remembered++;
  insert_tombstones(spi, tombstones, remembered);
  end_key_statements(spi);
  return (int64)deleted;
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
