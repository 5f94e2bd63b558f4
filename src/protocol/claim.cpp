#include "protocol/claim_secret.hpp"
#include "protocol/rules.hpp"

#include "boundary/subtransaction.hpp"
#include "fingerprint/key_digest.hpp"
#include "fingerprint/request_hash.hpp"
#include "protocol/claim.hpp"
#include "protocol/message_key.hpp"
#include "settings/settings.hpp"
#include "stats/stats.hpp"

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

// Runs a blocking heavyweight-lock wait until the deadline
// (idempotency.wait_timeout), inside a subtransaction so that reaching it can
// be caught and the transaction goes on. Returns false when the deadline
// passed. The session's own limits still hold, whichever ends first: a
// shorter lock_timeout ends the wait with PostgreSQL's 55P03, as it ends any
// lock wait, and statement_timeout with 57014; those errors, and any other
// (a deadlock, a cancel), are raised unchanged.
template <typename Wait> bool wait_until(TimestampTz deadline, Wait wait) {
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
      [deadline_first](const ErrorData *error) {
        return deadline_first &&
               error->sqlerrcode == ERRCODE_LOCK_NOT_AVAILABLE;
      });
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

bool claimed_elsewhere(const storage::KeyRef &key) {
  Claim claim = claim_for(key);
  LockAcquireResult taken = LockAcquire(&claim.tag, ExclusiveLock, false, true);
  if (taken == LOCKACQUIRE_NOT_AVAIL)
    return true;
  LockRelease(&claim.tag, ExclusiveLock, false);
  // Held by this transaction already: not elsewhere.
  return false;
}

namespace {

ClaimResult acquire_as_owner(Claim &claim, TimestampTz deadline) {
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

} // namespace

ClaimResult acquire(Claim &claim, TimestampTz deadline) {
  return with_owner(claim.owner, [&claim, deadline] {
    return acquire_as_owner(claim, deadline);
  });
}

void release(Claim &claim) {
  if (!claim.held)
    return;
  with_owner(claim.owner, [&claim] {
    return LockRelease(&claim.tag, ExclusiveLock, false);
  });
  claim.held = false;
}

bool wait_for_transaction(TransactionId holder, TimestampTz deadline) {
  if (deadline == 0)
    return false;
  return wait_until(deadline, [holder] {
    XactLockTableWait(holder, nullptr, nullptr, XLTW_None);
  });
}

namespace {

const int errcode_key_in_progress = MAKE_SQLSTATE('I', 'K', '4', '0', '9');
const int errcode_key_reused = MAKE_SQLSTATE('I', 'K', '4', '2', '2');
const int errcode_key_recursion = MAKE_SQLSTATE('I', 'K', '5', '0', '8');

bool same_bytes(const varlena *a, const varlena *b) {
  return VARSIZE_ANY_EXHDR(a) == VARSIZE_ANY_EXHDR(b) &&
         memcmp(VARDATA_ANY(a), VARDATA_ANY(b), VARSIZE_ANY_EXHDR(a)) == 0;
}

bool matches(const RequestMatch &request, const storage::KeyProbe &row) {
  // A table not yet updated to 0.4 holds fingerprints as text: the hex of
  // the 32 bytes, or a client's text from before 0.3, which the legacy form
  // turns into what the update would store.
  const bytea *stored =
      row.request_hash_is_hex
          ? fingerprint::legacy_client_fingerprint(row.request_hash)
          : row.request_hash;
  if (same_bytes(stored, request.fingerprint))
    return true;
  for (const bytea *earlier : request.earlier)
    if (earlier != nullptr && same_bytes(stored, earlier))
      return true;
  return request.deferred.compute != nullptr &&
         same_bytes(stored, request.deferred.compute(request.deferred.context));
}

pg_attribute_noreturn() void report_reused(const storage::KeyRef &key) {
  stats::count(stats::Event::mismatch);
  const char *shown = key_text(key);
  ereport(ERROR,
          (errcode(errcode_key_reused),
           errmsg("idempotency key \"%s\" was already used with a different "
                  "request",
                  shown),
           errdetail("A key identifies one request; its stored response "
                     "belongs to a request with another fingerprint."),
           errhint("Use a new idempotency key for a new request.")));
  pg_unreachable();
}

pg_attribute_noreturn() void report_recursion(const storage::KeyRef &key) {
  const char *shown = key_text(key);
  ereport(ERROR,
          (errcode(errcode_key_recursion),
           errmsg("idempotency key \"%s\" is already being processed by "
                  "this transaction",
                  shown),
           errdetail("The key was claimed earlier in this transaction and is "
                     "not yet complete: fn called idempotent_call with its "
                     "own key, or claim() was called twice.")));
  pg_unreachable();
}

TimestampTz wait_deadline() {
  int wait_ms = settings::wait_timeout_ms();
  if (wait_ms == 0)
    return 0;
  return TimestampTzPlusMilliseconds(GetCurrentTimestamp(), wait_ms);
}

} // namespace

// Called before ereport(): it may look up the catalog.
const char *key_text(const storage::KeyRef &key) {
  return key_for_message(key.key);
}

void report_in_progress(const storage::KeyRef &key) {
  stats::count(stats::Event::conflict);
  const char *shown = key_text(key);
  ereport(ERROR, (errcode(errcode_key_in_progress),
                  errmsg("idempotency key \"%s\" is being processed by another "
                         "transaction",
                         shown),
                  errhint("Retry the request later.")));
  pg_unreachable();
}

// A superuser bounds what a role may keep: a response over
// idempotency.max_response_size fails the call before anything is stored.
void check_response_size(const storage::KeyRef &key, Datum response,
                         bool response_is_null) {
  if (response_is_null)
    return;
  Size bytes = toast_raw_datum_size(response);
  if (bytes <= settings::max_response_bytes())
    return;
  const char *shown = key_text(key);
  ereport(ERROR,
          (errcode(ERRCODE_PROGRAM_LIMIT_EXCEEDED),
           errmsg("response of idempotency key \"%s\" is %zu bytes, over "
                  "idempotency.max_response_size (%zu bytes)",
                  shown, (size_t)bytes, (size_t)settings::max_response_bytes()),
           errhint("Store a smaller response, or ask a superuser to raise "
                   "idempotency.max_response_size.")));
}

storage::KeyRef key_argument(FunctionCallInfo fcinfo, int argno) {
  if (PG_ARGISNULL(argno))
    ereport(ERROR, (errcode(ERRCODE_NULL_VALUE_NOT_ALLOWED),
                    errmsg("idempotency key must not be null")));
  Size key_bytes = toast_raw_datum_size(PG_GETARG_DATUM(argno)) - VARHDRSZ;
  switch (check_key_size(key_bytes)) {
  case KeyCheck::ok:
    break;
  case KeyCheck::empty:
    ereport(ERROR, (errcode(ERRCODE_INVALID_PARAMETER_VALUE),
                    errmsg("idempotency key must not be empty")));
  case KeyCheck::too_long:
    ereport(ERROR,
            (errcode(ERRCODE_INVALID_PARAMETER_VALUE),
             errmsg("idempotency key is %zu bytes long, the limit is %zu",
                    (size_t)key_bytes, max_key_bytes)));
  }
  text *key = PG_GETARG_TEXT_PP(argno);
  storage::KeyRef ref{};
  ref.scope = GetUserId();
  ref.key = key;
  ref.digest = fingerprint::digest_of_key(key, &ref.unordered_digest);
  ref.legacy_digest = fingerprint::legacy_digest_of_key(key);
  ref.tenant_type = InvalidOid;
  return ref;
}

storage::KeyRef request_key(FunctionCallInfo fcinfo, Keying keying) {
  if (keying == Keying::by_role)
    return key_argument(fcinfo, key_argno(keying));
  if (PG_ARGISNULL(0))
    ereport(ERROR, (errcode(ERRCODE_NULL_VALUE_NOT_ALLOWED),
                    errmsg("tenant must not be null")));
  Oid tenant_type = get_fn_expr_argtype(fcinfo->flinfo, 0);
  if (!OidIsValid(tenant_type) || tenant_type == UNKNOWNOID)
    ereport(ERROR,
            (errcode(ERRCODE_DATATYPE_MISMATCH), errmsg("tenant has no type"),
             errhint("Cast the tenant to the type of the distribution "
                     "column, e.g. 42::bigint.")));
  storage::KeyRef key = key_argument(fcinfo, key_argno(keying));
  // idempotency.tenant_keys keeps the unordered digest: its rows live in
  // Citus shards, which the update to 0.7 leaves as they are.
  if (key.unordered_digest != nullptr)
    key.digest = key.unordered_digest;
  key.unordered_digest = nullptr;
  key.has_tenant = true;
  key.tenant_type = tenant_type;
  key.tenant = PG_GETARG_DATUM(0);
  return key;
}

TakenKey take_key(const storage::KeyTable &table, const storage::KeyRef &key,
                  const RequestMatch &request, TimestampTz now,
                  const char *command, ResourceOwner owner) {
  TimestampTz deadline = wait_deadline();
  // The claim's tag is derived only when the key must be claimed: a replay,
  // the common retry, needs none.
  Claim claim{};

  // Each pass looks at the key afresh: after a wait the holder may have
  // committed (replay), rolled back (proceed), or still hold it (wait or
  // IK409).
  for (;;) {
    storage::KeyProbe stored = storage::probe(table, key, now);
    if (stored.state == storage::KeyState::done) {
      release(claim);
      if (!matches(request, stored))
        report_reused(key);
      stats::count(stats::Event::replayed);
      return TakenKey{true, stored, claim};
    }

    PreventCommandIfReadOnly(command);
    PreventCommandIfParallelMode(command);

    if (stored.state == storage::KeyState::in_progress) {
      release(claim);
      if (!wait_for_transaction(stored.holder, deadline))
        report_in_progress(key);
      continue;
    }

    if (claim.held)
      return TakenKey{false, stored, claim};

    claim = claim_for(key, owner);
    switch (acquire(claim, deadline)) {
    case ClaimResult::acquired:
      continue; // look again: the key may have been stored meanwhile
    case ClaimResult::busy:
      report_in_progress(key);
    case ClaimResult::recursive:
      report_recursion(key);
    }
  }
}

} // namespace idempotency::protocol
