#include "idempotency/fingerprint/fingerprint.hpp"
#include "idempotency/fingerprint/request_hash.hpp"

#include "idempotency/protocol/call.hpp"
#include "idempotency/boundary/sqlstates.hpp"
#include "idempotency/boundary/subtransaction.hpp"
#include "idempotency/protocol/fn.hpp"
#include "idempotency/settings/settings.hpp"
#include "idempotency/stats/stats.hpp"
#include "idempotency/storage/citus.hpp"
#include "idempotency/storage/secrets.hpp"
#include "idempotency/storage/key_store.hpp"

extern "C" {
#include "access/detoast.h"
#include "catalog/namespace.h"
#include "lib/stringinfo.h"
#include "mb/pg_wchar.h"
#include "miscadmin.h"
#include "storage/lmgr.h"
#include "storage/proc.h"
#include "utils/datum.h"
#include "utils/guc.h"
#include "utils/lsyscache.h"
#include "utils/timestamp.h"
}

namespace idempotency::protocol {

// --- idempotent_call and tenant_call -----------------------------------------

namespace {

struct Request {
  storage::KeyRef key;
  bytea *fingerprint; // 32 raw bytes, as the key's row stores it
  FnArgs args;
  Statement *statement;
};
static_assert(std::is_trivially_destructible_v<Request>);

// The statement fn's text prepares, what fn receives, and the request's
// fingerprint: of fn, the types fn receives and their values, or, when the
// client passed its own request_hash, of fn and the client's text (the same
// key and hash with another fn is another request).
Request prepare_request(const CallRequest &call) {
  Request request;
  request.key = call.key;
  request.statement = statement_for(call.fn, call.given);
  request.args = received_args(*request.statement, call.given);
  request.fingerprint =
      call.client_hash == nullptr
          ? fingerprint::request_hash(request.statement->fingerprint_prefix,
                                      request.statement->encoders, request.args)
          : fingerprint::client_fingerprint(call.fn, call.client_hash);
  return request;
}

CallResult replay(const storage::KeyProbe &stored) {
  record_last_call(is_error_document(stored.response, stored.response_is_null)
                       ? Outcome::replayed_error
                       : Outcome::replayed,
                   stored.created_at, stored.expires_at);
  return CallResult{stored.response, stored.response_is_null};
}

CallResult run_and_store(const storage::KeyStore &store, const Request &request,
                         TakenKey &taken) {
  // The TTL and remember window in force when the key was claimed,
  // whatever fn sets.
  Interval ttl = settings::ttl();
  Interval remember = settings::remember();
  bool response_is_null;
  bool is_error;
  int citus_guc_level = storage::citus::begin_fn();
  Datum response = run_fn_storing_errors(*request.statement, request.args,
                                         &response_is_null, &is_error);
  storage::citus::end_fn(citus_guc_level);
  check_response_size(request.key, response, response_is_null);
  const storage::KeyProbe *replaces =
      taken.stored.state == storage::KeyState::expired ? &taken.stored
                                                       : nullptr;
  storage::StoredRow times = store.store(
      request.key, storage::NewRow{request.fingerprint, response,
                                   response_is_null, ttl, remember, replaces,
                                   GetCurrentTransactionStartTimestamp()});

  // The row now shows the key as in progress to everyone else (a tenant
  // key's row does not: its claim is kept until the transaction ends).
  if (store.row_shows_in_progress())
    release(taken.claim);
  stats::count(stats::Event::ran);
  record_last_call(is_error ? Outcome::stored_error : Outcome::ran,
                   times.created_at, times.expires_at);
  return CallResult{response, response_is_null};
}

} // namespace

CallResult idempotent_call(const CallRequest &call) {
  Request request = prepare_request(call);
  // A key is expected to be what this backend's last call found: a new key
  // is then claimed before it is looked up (once), a retry looked up
  // without a claim. A backend mostly serves one kind of call in a row
  // (new requests, or a client's burst of retries); a wrong guess costs a
  // second look (about 17,000 instructions) or a claim (about 9,000), never
  // a different outcome.
  static KeyExpected expected = KeyExpected::new_key;
  storage::KeyStore store = storage::key_store_for(request.key);
  TakenKey taken =
      take_key(store, request.key, request.fingerprint,
               GetCurrentTransactionStartTimestamp(),
               request.key.has_tenant ? "idempotency.tenant_call"
                                      : "idempotency.idempotent_call",
               nullptr, expected);
  expected = taken.replay ? KeyExpected::stored : KeyExpected::new_key;
  if (taken.replay)
    return replay(taken.stored);
  return run_and_store(store, request, taken);
}

// --- taking a key: the probe/claim loop of idempotent_call and claim() -------

namespace {

bool same_bytes(const varlena *a, const varlena *b) {
  return VARSIZE_ANY_EXHDR(a) == VARSIZE_ANY_EXHDR(b) &&
         memcmp(VARDATA_ANY(a), VARDATA_ANY(b), VARSIZE_ANY_EXHDR(a)) == 0;
}

[[noreturn]] void report_reused(const storage::KeyRef &key) {
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

[[noreturn]] void report_recursion(const storage::KeyRef &key) {
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

// A retry of a key whose response is no longer kept: it ran, and must not
// run again while its tombstone lasts.
[[noreturn]] void report_gone(const storage::KeyRef &key,
                              const storage::KeyProbe &stored) {
  stats::count(stats::Event::late_retry);
  const char *shown = key_text(key);
  const char *ran_at = pstrdup(timestamptz_to_str(stored.created_at));
  const char *expired_at =
      pstrdup(timestamptz_to_str(stored.response_expired_at));
  const char *forgotten_at = pstrdup(timestamptz_to_str(stored.expires_at));
  ereport(ERROR,
          (errcode(errcode_key_gone),
           errmsg("idempotency key \"%s\" already ran at %s; its response is "
                  "no longer kept",
                  shown, ran_at),
           errdetail("Its response expired at %s; the key is remembered, and "
                     "a retry of the same request refused, until %s.",
                     expired_at, forgotten_at),
           errhint("The request must not run again. Use a new idempotency "
                   "key only for a new request.")));
  pg_unreachable();
}

TimestampTz wait_deadline() {
  int wait_ms = settings::wait_timeout_ms();
  if (wait_ms == 0)
    return 0;
  return TimestampTzPlusMilliseconds(GetCurrentTimestamp(), wait_ms);
}

} // namespace

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

TakenKey take_key(const storage::KeyStore &store, const storage::KeyRef &key,
                  const bytea *fingerprint, TimestampTz now,
                  const char *command, ResourceOwner owner,
                  KeyExpected expected) {
  TimestampTz deadline = wait_deadline();
  // A key expected new is claimed first, so that it is looked up once, after
  // the claim; a key expected stored (a retry) is looked up first and its
  // replay needs no claim. Either way every outcome is decided by a look at
  // the key: when the claim is not free at once, the loop below runs as for
  // a retry.
  Claim claim{};
  if (expected == KeyExpected::new_key && !XactReadOnly &&
      !IsInParallelMode()) {
    // Taken only if that is immediate (no wait: deadline 0); busy or
    // already held by this transaction, the loop below decides.
    claim = claim_for(key, owner);
    (void)acquire(claim, 0);
  }

  // Each pass looks at the key afresh: after a wait the holder may have
  // committed (replay), rolled back (proceed), or still hold it (wait or
  // IK409).
  for (;;) {
    storage::KeyProbe stored = store.probe(key, now);
    if (stored.state == storage::KeyState::done) {
      release(claim);
      if (!same_bytes(stored.request_hash, fingerprint))
        report_reused(key);
      stats::count(stats::Event::replayed);
      return TakenKey{true, stored, claim};
    }
    if (stored.state == storage::KeyState::gone) {
      release(claim);
      if (!same_bytes(stored.request_hash, fingerprint))
        report_reused(key);
      report_gone(key, stored);
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
    // Look again: taken, the key may have been stored meanwhile; released
    // by its holder, a replay mostly, or the key to claim.
    case ClaimResult::acquired:
    case ClaimResult::released:
      continue;
    case ClaimResult::busy:
      report_in_progress(key);
    case ClaimResult::recursive:
      report_recursion(key);
    }
  }
}

// --- claims: who may run fn for a key right now ------------------------------

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

// --- a key in an error message -----------------------------------------------

namespace {

struct ClientConversion {
  int from;
  int to;
  Oid proc; // InvalidOid: none, so nothing beyond ASCII converts
};

bool converts(const ClientConversion &conversion, const char *character,
              int length) {
  if (!OidIsValid(conversion.proc))
    return false;
  unsigned char converted[MAX_MULTIBYTE_CHAR_LEN * MAX_CONVERSION_GROWTH + 1];
  int done = pg_do_encoding_conversion_buf(
      conversion.proc, conversion.from, conversion.to,
      reinterpret_cast<unsigned char *>(const_cast<char *>(character)), length,
      converted, sizeof(converted), true /* noError */);
  return done == length;
}

void append_escaped(StringInfo out, int encoding, const char *character,
                    int length) {
  if (encoding == PG_UTF8) {
    pg_wchar code =
        utf8_to_unicode(reinterpret_cast<const unsigned char *>(character));
    appendStringInfo(out, code <= 0xFFFF ? "\\u%04X" : "\\U%08X",
                     (unsigned)code);
    return;
  }
  for (int i = 0; i < length; i++)
    appendStringInfo(out, "\\x%02X", (unsigned char)character[i]);
}

} // namespace

char *key_for_message(const text *key) {
  const char *data = VARDATA_ANY(key);
  int size = VARSIZE_ANY_EXHDR(key);
  ClientConversion conversion{GetDatabaseEncoding(), pg_get_client_encoding(),
                              InvalidOid};
  // No conversion happens on the way to the client.
  if (conversion.from == conversion.to || conversion.from == PG_SQL_ASCII ||
      conversion.to == PG_SQL_ASCII)
    return pnstrdup(data, size);
  conversion.proc = FindDefaultConversionProc(conversion.from, conversion.to);

  StringInfoData out;
  initStringInfo(&out);
  for (int at = 0; at < size;) {
    const char *character = data + at;
    int length = Min(pg_encoding_mblen(conversion.from, character), size - at);
    if (!IS_HIGHBIT_SET(*character) || converts(conversion, character, length))
      appendBinaryStringInfo(&out, character, length);
    else
      append_escaped(&out, conversion.from, character, length);
    at += length;
  }
  return out.data;
}

// Called before ereport(): it may look up the catalog.
const char *key_text(const storage::KeyRef &key) {
  return key_for_message(key.key);
}

// --- the limit on a stored response ------------------------------------------

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

// --- the session's last call -------------------------------------------------

namespace {
LastCall last{Outcome::none, false, 0, 0};
} // namespace

void clear_last_call() { last = LastCall{Outcome::none, false, 0, 0}; }

void record_last_call(Outcome outcome) {
  last = LastCall{outcome, false, 0, 0};
}

void record_last_call(Outcome outcome, TimestampTz created_at,
                      TimestampTz expires_at) {
  last = LastCall{outcome, true, created_at, expires_at};
}

const LastCall &last_call() { return last; }

const char *outcome_name(Outcome outcome) {
  switch (outcome) {
  case Outcome::none:
    break;
  case Outcome::ran:
    return "ran";
  case Outcome::replayed:
    return "replayed";
  case Outcome::stored_error:
    return "stored_error";
  case Outcome::replayed_error:
    return "replayed_error";
  }
  return nullptr;
}

} // namespace idempotency::protocol
