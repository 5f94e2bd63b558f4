#include "protocol/claim.hpp"

#include "protocol/claim_secret.hpp"

namespace idempotency::protocol {

namespace {

// The top bit of locktag_field4 marks claim locks: it keeps them apart from
// pg_advisory_lock's tags (field4 1 and 2), and pg_locks, which shows field4
// as the smallint objsubid, shows every claim with a negative objsubid.
constexpr uint16 claim_lock_class = 0x8000;
constexpr uint16 field4_mac_mask = 0x7FFF;

void append_be32(uint8 *out, uint32 value) {
  out[0] = (uint8)(value >> 24);
  out[1] = (uint8)(value >> 16);
  out[2] = (uint8)(value >> 8);
  out[3] = (uint8)value;
}

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

// The tag is database, role, then 47 bits of HMAC-SHA256(cluster secret,
// database || role || key):
// - the role sits in the tag itself, so no key of one role can ever take
//   another role's lock, however it is chosen;
// - the MAC covers database and role too, so two roles (or databases)
//   working on the same key text show unrelated bits in pg_locks, and
//   without the secret nobody can tell which key a tag belongs to;
// - within one role and database, a claim falsely meets another key in
//   flight with probability n / 2^47: with 50,000 keys in flight that is
//   3.6e-10 per claim, and 50,000^2 / 2^48 = 8.9e-6 that any two of them
//   meet. A false meeting costs a retry (IK409), never a second execution:
//   the primary key decides that.
Claim claim_for(const storage::KeyRef &key) {
  uint8 prefix[8];
  append_be32(prefix, MyDatabaseId);
  append_be32(prefix + 4, key.scope);
  fingerprint::HmacSha256 mac = claim_mac();
  mac.update(prefix, sizeof prefix);
  mac.update(VARDATA_ANY(key.key), VARSIZE_ANY_EXHDR(key.key));
  uint8 digest[fingerprint::HmacSha256::mac_size];
  mac.finish(digest);

  uint32 field3 = ((uint32)digest[0] << 24) | ((uint32)digest[1] << 16) |
                  ((uint32)digest[2] << 8) | (uint32)digest[3];
  uint16 field4 = claim_lock_class |
                  ((((uint16)digest[4] << 8) | digest[5]) & field4_mac_mask);
  Claim claim{};
  SET_LOCKTAG_ADVISORY(claim.tag, MyDatabaseId, key.scope, field3, field4);
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
