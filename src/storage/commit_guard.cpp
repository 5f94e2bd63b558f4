#include "idempotency/storage/commit_guard.hpp"

extern "C" {
#include "access/xact.h"
#include "utils/memutils.h"
#include "utils/timestamp.h"
}

namespace idempotency::storage::commit_guard {

namespace {

// earliest[level]: the earliest expires_at written at nesting level `level` (1:
// the top), committed subtransactions below it included; none above `deepest`.
TimestampTz *earliest = nullptr;
int capacity = 0;
int deepest = 0;

} // namespace

void at_pre_commit() {
  TimestampTz expires_at = DT_NOEND;
  for (int level = 1; level <= deepest; level++)
    expires_at = Min(expires_at, earliest[level]);
  if (expires_at == DT_NOEND || expires_at > GetCurrentTimestamp())
    return;
  ereport(ERROR,
          (errcode(ERRCODE_T_R_SERIALIZATION_FAILURE),
           errmsg("an idempotency key stored by this transaction expired "
                  "before the transaction committed"),
           errdetail("The key expired at %s. Committed now, it would be "
                     "absent at once, and a retry would run its request "
                     "again.",
                     timestamptz_to_str(expires_at)),
           errhint("Retry the transaction; if it keeps failing, make it "
                   "shorter or raise idempotency.ttl.")));
}

void note_key_written(TimestampTz expires_at) {
  int level = GetCurrentTransactionNestLevel();
  if (level >= capacity) {
    int wanted = Max(level + 1, Max(capacity * 2, 8));
    earliest = static_cast<TimestampTz *>(
        earliest == nullptr
            ? MemoryContextAlloc(TopMemoryContext, wanted * sizeof(TimestampTz))
            : repalloc(earliest, wanted * sizeof(TimestampTz)));
    capacity = wanted;
  }
  for (int unused = deepest + 1; unused <= level; unused++)
    earliest[unused] = DT_NOEND;
  deepest = Max(deepest, level);
  earliest[level] = Min(earliest[level], expires_at);
}

void at_transaction_end() { deepest = 0; }

void at_subtransaction_commit() {
  int level = GetCurrentTransactionNestLevel();
  if (level > deepest)
    return;
  earliest[level - 1] = Min(earliest[level - 1], earliest[level]);
  deepest = level - 1;
}

void at_subtransaction_abort() {
  deepest = Min(deepest, GetCurrentTransactionNestLevel() - 1);
}

} // namespace idempotency::storage::commit_guard
