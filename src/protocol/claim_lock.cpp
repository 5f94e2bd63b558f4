#include "idempotency/fingerprint/fingerprint.hpp"

#include "idempotency/boundary/subtransaction.hpp"
#include "idempotency/protocol/claim_lock.hpp"
#include "idempotency/storage/claim_secret.hpp"

extern "C" {
#include "miscadmin.h"
#include "storage/lmgr.h"
#include "storage/proc.h"
#include "utils/datum.h"
#include "utils/guc.h"
#include "utils/lsyscache.h"
}

namespace idempotency::protocol {

namespace {

// An HMAC-SHA256 keyed with the cluster's claim secret, ready for a message;
// copy it for each one. Reads (or creates) the secret on the first call in
// this backend.
const fingerprint::HmacSha256 &claim_mac() {
  // Keyed with nothing until the secret is loaded; never used before then.
  static fingerprint::HmacSha256 keyed(nullptr, 0);
  static bool loaded = false;
  if (!loaded) {
    storage::ClaimSecret secret = storage::read_claim_secret();
    keyed = fingerprint::HmacSha256(secret.bytes, sizeof secret.bytes);
    explicit_bzero(secret.bytes, sizeof secret.bytes);
    loaded = true;
  }
  return keyed;
}

// The top bit of locktag_field4 marks claim locks: it keeps them apart from
// pg_advisory_lock's tags (field4 1 and 2), and pg_locks, which shows field4
// as the smallint objsubid, shows every claim with a negative objsubid.
constexpr uint16 claim_lock_class = 0x8000;
constexpr uint16 field4_mac_mask = 0x7FFF;

// A claim is the tag in ExclusiveLock, always taken without waiting. Callers
// wait for it in RowShareLock, which conflicts with ExclusiveLock and not
// with itself: when the holder lets go, the lock manager grants every waiter
// together, and each looks at the key again at once (a replay, mostly). A
// waiter that took the claim itself and let go of it instead would hand it
// to the next waiter in the queue, which lets go of it in turn: the claim
// would pass from waiter to waiter while each retried in vain.
constexpr LOCKMODE claim_mode = ExclusiveLock;
constexpr LOCKMODE waiter_mode = RowShareLock;

void append_be32(uint8 *out, uint32 value) {
  out[0] = (uint8)(value >> 24);
  out[1] = (uint8)(value >> 16);
  out[2] = (uint8)(value >> 8);
  out[3] = (uint8)value;
}

// Runs a blocking heavyweight-lock wait until the deadline
// (idempotency.wait_timeout), inside a subtransaction so that reaching it can
// be caught and the transaction goes on. Returns false when the deadline
// passed. The session's own limits still hold, whichever ends first: a
// shorter lock_timeout ends the wait with PostgreSQL's 55P03, as it ends any
// lock wait, and statement_timeout with 57014; those errors, and any other
// (a deadlock, a cancel), are raised unchanged. `undo` runs on any error,
// after the subtransaction's rollback.
template <typename Wait, typename Undo>
bool wait_until(TimestampTz deadline, Wait wait, Undo undo) {
  long remaining_ms =
      TimestampDifferenceMilliseconds(GetCurrentTimestamp(), deadline);
  if (remaining_ms <= 0)
    return false;
  // Which timer ends the wait: lock_timeout when it is set and shorter, or
  // the deadline, put in lock_timeout's place for the wait.
  bool deadline_first = LockTimeout <= 0 || remaining_ms <= LockTimeout;
  char timeout[32];
  snprintf(timeout, sizeof(timeout), "%ld", remaining_ms);

  return run_in_subtransaction(
      [&] {
        int guc_level = NewGUCNestLevel();
        if (deadline_first)
          set_config_option("lock_timeout", timeout, PGC_USERSET, PGC_S_SESSION,
                            GUC_ACTION_SAVE, true, 0, false);
        wait();
        // A lock timeout that fired just as the lock was granted leaves a
        // cancel pending; take it here, where it counts as a timeout.
        CHECK_FOR_INTERRUPTS();
        AtEOXact_GUC(true, guc_level);
      },
      [deadline_first, &undo](const ErrorData *error) {
        undo();
        return deadline_first &&
               error->sqlerrcode == ERRCODE_LOCK_NOT_AVAILABLE;
      });
}

template <typename Wait> bool wait_until(TimestampTz deadline, Wait wait) {
  return wait_until(deadline, wait, [] {});
}

// Runs `body` with `owner` as the current resource owner (nullptr: as is),
// so that the locks it takes or releases are that owner's. An error leaves
// the owner set; error recovery resets CurrentResourceOwner.
template <typename Body> auto with_owner(ResourceOwner owner, Body body) {
  ResourceOwner saved = CurrentResourceOwner;
  if (owner != nullptr)
    CurrentResourceOwner = owner;
  auto result = body();
  CurrentResourceOwner = saved;
  return result;
}

// A tenant key's claim covers the tenant too: one key text under two
// tenants is two keys. The tenant's bytes follow the key's, after a byte
// that keeps the two apart.
void update_with_tenant(fingerprint::HmacSha256 &mac,
                        const storage::KeyRef &key) {
  const uint8 separator = 0;
  mac.update(&separator, 1);
  int16 length;
  bool by_value;
  get_typlenbyval(key.tenant_type, &length, &by_value);
  if (by_value) {
    mac.update(reinterpret_cast<const uint8 *>(&key.tenant), (size_t)length);
  } else if (length == -1) {
    varlena *value = pg_detoast_datum_packed(
        reinterpret_cast<varlena *>(DatumGetPointer(key.tenant)));
    mac.update(reinterpret_cast<const uint8 *>(VARDATA_ANY(value)),
               VARSIZE_ANY_EXHDR(value));
  } else {
    Size size = datumGetSize(key.tenant, by_value, length);
    mac.update(reinterpret_cast<const uint8 *>(DatumGetPointer(key.tenant)),
               size);
  }
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
Claim claim_for(const storage::KeyRef &key, ResourceOwner owner) {
  uint8 prefix[8];
  append_be32(prefix, MyDatabaseId);
  append_be32(prefix + 4, key.scope);
  fingerprint::HmacSha256 mac = claim_mac();
  mac.update(prefix, sizeof prefix);
  mac.update(VARDATA_ANY(key.key), VARSIZE_ANY_EXHDR(key.key));
  if (key.has_tenant)
    update_with_tenant(mac, key);
  uint8 digest[fingerprint::HmacSha256::mac_size];
  mac.finish(digest);

  uint32 field3 = ((uint32)digest[0] << 24) | ((uint32)digest[1] << 16) |
                  ((uint32)digest[2] << 8) | (uint32)digest[3];
  uint16 field4 = claim_lock_class |
                  ((((uint16)digest[4] << 8) | digest[5]) & field4_mac_mask);
  Claim claim{};
  SET_LOCKTAG_ADVISORY(claim.tag, MyDatabaseId, key.scope, field3, field4);
  claim.held = false;
  claim.owner = owner;
  return claim;
}

namespace {

// Whether another transaction holds the claim of `tag` (or queues to take
// it); waiters passing through in waiter_mode do not count.
bool held_by_claimer(const LOCKTAG &tag) {
  LockAcquireResult taken = LockAcquire(&tag, waiter_mode, false, true);
  if (taken == LOCKACQUIRE_NOT_AVAIL)
    return true;
  LockRelease(&tag, waiter_mode, false);
  return false;
}

// Waits until the claim's holder lets go of it, together with every other
// waiter; takes nothing.
bool wait_for_release(const LOCKTAG &tag, TimestampTz deadline) {
  return wait_until(deadline, [&tag] {
    LockAcquire(&tag, waiter_mode, false, false);
    LockRelease(&tag, waiter_mode, false);
  });
}

// Waits for the claim itself and keeps it, for the current resource owner
// (the claim's), not the wait's subtransaction, which would hand it to its
// parent's owner when it ends. Only for a claim nobody holds: waiters just
// woken still pass through it, and a conditional attempt could keep missing.
bool wait_for_claim(Claim &claim, TimestampTz deadline) {
  ResourceOwner owner = CurrentResourceOwner;
  const LOCKTAG *tag = &claim.tag;
  volatile bool granted = false;
  bool taken = wait_until(
      deadline,
      [owner, tag, &granted] {
        ResourceOwner wait_owner = CurrentResourceOwner;
        CurrentResourceOwner = owner;
        LockAcquire(tag, claim_mode, false, false);
        CurrentResourceOwner = wait_owner;
        granted = true;
      },
      // Granted, then an error (a timeout that fired at the grant, a
      // cancel): the claim is not taken.
      [tag, &granted] {
        if (granted)
          LockRelease(tag, claim_mode, false);
      });
  claim.held = taken;
  return taken;
}

} // namespace

bool claimed_elsewhere(const storage::KeyRef &key) {
  Claim claim = claim_for(key);
  return held_by_claimer(claim.tag);
}

namespace {

ClaimResult acquire_as_owner(Claim &claim, TimestampTz deadline) {
  LockAcquireResult taken = LockAcquire(&claim.tag, claim_mode, false, true);
  if (taken == LOCKACQUIRE_ALREADY_HELD || taken == LOCKACQUIRE_ALREADY_CLEAR) {
    LockRelease(&claim.tag, claim_mode, false);
    return ClaimResult::recursive;
  }
  if (taken != LOCKACQUIRE_NOT_AVAIL) {
    claim.held = true;
    return ClaimResult::acquired;
  }
  if (deadline == 0)
    return ClaimResult::busy;
  // Held by another claimer: wait with the other waiters, then look at the
  // key again. Held by none: only waiters just woken pass through it.
  if (held_by_claimer(claim.tag))
    return wait_for_release(claim.tag, deadline) ? ClaimResult::released
                                                 : ClaimResult::busy;
  return wait_for_claim(claim, deadline) ? ClaimResult::acquired
                                         : ClaimResult::busy;
}

} // namespace

ClaimResult acquire(Claim &claim, TimestampTz deadline) {
  return with_owner(claim.owner, [&claim, deadline] {
    return acquire_as_owner(claim, deadline);
  });
}

void release(Claim &claim) {
  if (!claim.held)
    return;
  with_owner(claim.owner,
             [&claim] { return LockRelease(&claim.tag, claim_mode, false); });
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
