#include "protocol/claim.hpp"

extern "C" {
#include "common/hashfn.h"
}

namespace idempotency::protocol {

namespace {

// locktag_field4 of claim locks: keeps them apart from pg_advisory_lock's
// tags (which use 1 and 2); pg_locks shows it as objsubid.
constexpr uint16 claim_lock_class = 0x4B49; // "IK"

// Runs a blocking heavyweight-lock wait with lock_timeout set to what is left
// until the deadline, inside a subtransaction so a timeout can be caught and
// the transaction goes on. Returns false on timeout; any other error (a
// deadlock, a cancel) is raised unchanged.
template <typename Wait> bool wait_until(TimestampTz deadline, Wait wait) {
  long remaining_ms =
      TimestampDifferenceMilliseconds(GetCurrentTimestamp(), deadline);
  if (remaining_ms <= 0)
    return false;
  char timeout[32];
  snprintf(timeout, sizeof(timeout), "%ld", remaining_ms);

  MemoryContext context = CurrentMemoryContext;
  ResourceOwner owner = CurrentResourceOwner;
  bool finished = true;

  BeginInternalSubTransaction(nullptr);
  MemoryContextSwitchTo(context);
  PG_TRY();
  {
    int guc_level = NewGUCNestLevel();
    set_config_option("lock_timeout", timeout, PGC_USERSET, PGC_S_SESSION,
                      GUC_ACTION_SAVE, true, 0, false);
    wait();
    // A lock timeout that fired just as the lock was granted leaves a cancel
    // pending; take it here, where it counts as a timeout, not later.
    CHECK_FOR_INTERRUPTS();
    AtEOXact_GUC(true, guc_level);
    ReleaseCurrentSubTransaction();
  }
  PG_CATCH();
  {
    MemoryContextSwitchTo(context);
    ErrorData *error = CopyErrorData();
    FlushErrorState();
    RollbackAndReleaseCurrentSubTransaction();
    MemoryContextSwitchTo(context);
    CurrentResourceOwner = owner;
    if (error->sqlerrcode != ERRCODE_LOCK_NOT_AVAILABLE)
      ReThrowError(error);
    FreeErrorData(error);
    finished = false;
  }
  PG_END_TRY();
  MemoryContextSwitchTo(context);
  CurrentResourceOwner = owner;
  return finished;
}

} // namespace

Claim claim_for(const storage::KeyRef &key) {
  uint64 hash = hash_bytes_extended(
      reinterpret_cast<const unsigned char *>(VARDATA_ANY(key.key)),
      VARSIZE_ANY_EXHDR(key.key), key.scope);
  Claim claim{};
  SET_LOCKTAG_ADVISORY(claim.tag, MyDatabaseId, (uint32)(hash >> 32),
                       (uint32)hash, claim_lock_class);
  claim.held = false;
  return claim;
}

ClaimResult acquire(Claim &claim, TimestampTz deadline) {
  LockAcquireResult taken = LockAcquire(&claim.tag, ExclusiveLock, false, true);
  if (taken == LOCKACQUIRE_ALREADY_HELD || taken == LOCKACQUIRE_ALREADY_CLEAR) {
    LockRelease(&claim.tag, ExclusiveLock, false);
    return ClaimResult::recursive;
  }
  // Wait for the holder inside wait_until's subtransaction, but take the
  // claim itself outside it: a lock taken in a subtransaction passes to the
  // transaction's resource owner, where release() could not find it.
  LOCKTAG *tag = &claim.tag;
  while (taken == LOCKACQUIRE_NOT_AVAIL) {
    if (deadline == 0 || !wait_until(deadline, [tag] {
          LockAcquire(tag, ExclusiveLock, false, false);
          LockRelease(tag, ExclusiveLock, false);
        }))
      return ClaimResult::busy;
    taken = LockAcquire(tag, ExclusiveLock, false, true);
  }
  claim.held = true;
  return ClaimResult::acquired;
}

void release(Claim &claim) {
  if (!claim.held)
    return;
  LockRelease(&claim.tag, ExclusiveLock, false);
  claim.held = false;
}

bool wait_for_transaction(TransactionId holder, TimestampTz deadline) {
  if (deadline == 0)
    return false;
  return wait_until(deadline, [holder] {
    XactLockTableWait(holder, nullptr, nullptr, XLTW_None);
  });
}

} // namespace idempotency::protocol
