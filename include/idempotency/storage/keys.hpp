// Key storage: the table idempotency.keys, whose primary key is (scope,
// key_digest); the key's text is kept in the row and compared on every
// lookup. Reads go straight to the index with a dirty snapshot, which also
// sees rows of open transactions: that is how a call learns that another
// transaction holds a key, and which one to wait for. Writes are INSERT and
// DELETE statements run as the table's owner (storage/owner_statements.hpp),
// so defaults, constraints, triggers, indexes and logical replication apply.
#pragma once

#include "idempotency/pg.hpp"
#include "idempotency/storage/citus.hpp"
#include "idempotency/storage/key_store.hpp"

extern "C" {
#include "access/htup.h"
#include "datatype/timestamp.h"
#include "storage/lockdefs.h"
#include "utils/relcache.h"
#include "utils/timestamp.h"
}

namespace idempotency::storage {

// Raises 42P01 when idempotency.keys is missing and 0A000 when Citus has
// taken it over (its rows are then in shards); cached until an invalidation.
KeyTable key_table();

// Without raising; not_citus when the table does not exist.
citus::TableKind key_table_citus_kind();

// Whether `row`, seen by a BEFORE INSERT trigger on `rel`, is one the
// extension is inserting into idempotency.keys: keys_loaded leaves those be.
bool is_own_insert(Relation rel, HeapTuple row);

// A live row's window after its TTL comes from: none (0.7's table), the
// reader's idempotency.remember (1.0's), or the row's remember_for, NULL for
// rows_without_window_usecs (docs/expiry.md#when-a-keys-windows-are-fixed).
enum class WindowSource { none, reader_setting, stored };

struct RememberWindow {
  WindowSource source;
  bool stored_isnull;
  Interval stored; // remember_for, when source is stored and not NULL
};
static_assert(std::is_trivially_destructible_v<RememberWindow>);

// 7 days (idempotency.remember's default) as exact time.
constexpr int64 rows_without_window_usecs = INT64CONST(7) * USECS_PER_DAY;

// `read(attnum, &isnull)` reads one of the live row's columns.
template <typename Columns, typename Read>
RememberWindow remember_window(const Columns &columns, Read read) {
  RememberWindow window{WindowSource::none, true, Interval{}};
  if (columns.expired_at == InvalidAttrNumber)
    return window;
  window.source = WindowSource::reader_setting;
  if (columns.remember_for == InvalidAttrNumber)
    return window;
  window.source = WindowSource::stored;
  Datum value = read(columns.remember_for, &window.stored_isnull);
  if (!window.stored_isnull)
    window.stored = *DatumGetIntervalP(value);
  return window;
}

// remember_for as stored for a span in exact time: NULL for the default
// span, so that a row under the default costs no more than before 1.1.
Datum stored_window(int64 usecs, bool *isnull);

// When a live row whose response expired at `expires_at` is forgotten; a
// stored span counts as exact time (a day 24 hours, a month 30 days).
TimestampTz live_row_forgotten_at(const RememberWindow &window,
                                  TimestampTz expires_at);

// A stored row's life as of `now`, by its times alone. A live row has
// expired_at NULL and expires_at when its response expires; a tombstone has
// expired_at set and expires_at when it is forgotten. A live row past its
// TTL is judged as the tombstone expiry would make of it.
enum class RowAge { live, gone, forgotten };

struct RowLife {
  RowAge age;
  TimestampTz response_expired_at; // gone, forgotten
  TimestampTz forgotten_at;        // gone, forgotten
};
static_assert(std::is_trivially_destructible_v<RowLife>);

// `expired_at` is read only for a tombstone, `window` only for a live row.
RowLife row_life(bool tombstone, const RememberWindow &window,
                 TimestampTz expires_at, TimestampTz expired_at,
                 TimestampTz now);

[[noreturn]] void report_schema_before_0_7();

// 40001: the expired row a new one replaces changed meanwhile (in practice,
// expiry made it a tombstone still in its window); the retry gets IK410.
[[noreturn]] void report_replaced_row_changed();

// Locks idempotency.keys in `mode` for the transaction; false when it is gone:
// DROP EXTENSION may commit between two of an expiry round's transactions.
bool lock_key_table(LOCKMODE mode);

} // namespace idempotency::storage
