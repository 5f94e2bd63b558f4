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

extern "C" {
#include "access/detoast.h"
#include "catalog/namespace.h"
#include "lib/stringinfo.h"
#include "mb/pg_wchar.h"
#include "miscadmin.h"
#include "port/pg_bswap.h"
#include "storage/lmgr.h"
#include "storage/proc.h"
#include "utils/datum.h"
#include "utils/guc.h"
#include "utils/jsonb.h"
#include "utils/lsyscache.h"
#include "utils/timestamp.h"
}

namespace idempotency::protocol {

namespace {

LastCall last{Outcome::none, false, 0, 0};

// Keyed with the cluster's claim secret, read on first use; copied per message.
const fingerprint::HmacSha256 &claim_mac() {
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

// Waiters use a mode that conflicts with the claim but not with itself, so
// all wake together when the holder lets go; waiting by taking the claim
// would pass it from waiter to waiter, each retrying in vain.
constexpr LOCKMODE claim_mode = ExclusiveLock;
constexpr LOCKMODE waiter_mode = RowShareLock;

// Runs a lock wait until the deadline, in a subtransaction so that reaching
// it can be caught (false). A shorter lock_timeout or statement_timeout
// still raises its own error. `undo` runs on any error, after the rollback.
template <typename Wait, typename Undo>
bool wait_until(TimestampTz deadline, Wait wait, Undo undo) {
  long remaining_ms =
      TimestampDifferenceMilliseconds(GetCurrentTimestamp(), deadline);
  if (remaining_ms <= 0)
    return false;
  bool deadline_first = LockTimeout <= 0 || remaining_ms <= LockTimeout;
  char *timeout = psprintf("%ld", remaining_ms);

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

// An error leaves `owner` set; error recovery resets CurrentResourceOwner.
template <typename Body> auto with_owner(ResourceOwner owner, Body body) {
  ResourceOwner saved = CurrentResourceOwner;
  if (owner != nullptr)
    CurrentResourceOwner = owner;
  auto result = body();
  CurrentResourceOwner = saved;
  return result;
}

// The tag is database, role, then 47 bits of HMAC-SHA256(cluster secret,
// database || role || key (|| 0 || tenant)): no key of one role can take
// another role's lock, and pg_locks does not tell which key a tag is. Two
// keys meet with probability n / 2^47, which costs a retry (IK409).
Claim claim_for(const storage::KeyRef &key, ResourceOwner owner) {
  uint32 prefix[2] = {pg_hton32(MyDatabaseId), pg_hton32(key.scope)};
  fingerprint::HmacSha256 mac = claim_mac();
  mac.update(prefix, sizeof prefix);
  mac.update(VARDATA_ANY(key.key), VARSIZE_ANY_EXHDR(key.key));
  if (key.has_tenant) {
    const uint8 separator = 0;
    mac.update(&separator, 1);
    int16 length;
    bool by_value;
    get_typlenbyval(key.tenant_type, &length, &by_value);
    if (by_value) {
      mac.update(&key.tenant, (size_t)length);
    } else if (length == -1) {
      varlena *value = PG_DETOAST_DATUM_PACKED(key.tenant);
      mac.update(VARDATA_ANY(value), VARSIZE_ANY_EXHDR(value));
    } else {
      mac.update(DatumGetPointer(key.tenant),
                 datumGetSize(key.tenant, by_value, length));
    }
  }
  uint8 digest[fingerprint::HmacSha256::mac_size];
  mac.finish(digest);

  uint32 field3 = ((uint32)digest[0] << 24) | ((uint32)digest[1] << 16) |
                  ((uint32)digest[2] << 8) | (uint32)digest[3];
  // field4's top bit keeps claims apart from pg_advisory_lock's (field4 1, 2).
  uint16 field4 = 0x8000 | ((((uint16)digest[4] << 8) | digest[5]) & 0x7FFF);
  Claim claim{};
  SET_LOCKTAG_ADVISORY(claim.tag, MyDatabaseId, key.scope, field3, field4);
  claim.owner = owner;
  return claim;
}

// Waiters passing through in waiter_mode do not count.
bool held_by_claimer(const LOCKTAG &tag) {
  LockAcquireResult taken = LockAcquire(&tag, waiter_mode, false, true);
  if (taken == LOCKACQUIRE_NOT_AVAIL)
    return true;
  LockRelease(&tag, waiter_mode, false);
  return false;
}

// released: the holder let go of the claim; look at the key again.
enum class ClaimResult { acquired, released, busy, recursive };

// With deadline 0, busy at once when another transaction holds the claim.
ClaimResult acquire(Claim &claim, TimestampTz deadline) {
  return with_owner(claim.owner, [&claim, deadline] {
    LockAcquireResult taken = LockAcquire(&claim.tag, claim_mode, false, true);
    if (taken == LOCKACQUIRE_ALREADY_HELD ||
        taken == LOCKACQUIRE_ALREADY_CLEAR) {
      LockRelease(&claim.tag, claim_mode, false);
      return ClaimResult::recursive;
    }
    if (taken != LOCKACQUIRE_NOT_AVAIL) {
      claim.held = true;
      return ClaimResult::acquired;
    }
    if (deadline == 0)
      return ClaimResult::busy;
    const LOCKTAG *tag = &claim.tag;
    if (!held_by_claimer(claim.tag)) {
      // Held by none: waiters just woken pass through it, and a conditional
      // attempt could keep missing. Kept for the claim's resource owner: the
      // wait's subtransaction would hand it to its parent's owner.
      ResourceOwner owner = CurrentResourceOwner;
      volatile bool granted = false;
      claim.held = wait_until(
          deadline,
          [owner, tag, &granted] {
            with_owner(owner, [tag] {
              return LockAcquire(tag, claim_mode, false, false);
            });
            granted = true;
          },
          // Granted, then an error (a timeout that fired at the grant, a
          // cancel): the claim is not taken.
          [tag, &granted] {
            if (granted)
              LockRelease(tag, claim_mode, false);
          });
      return claim.held ? ClaimResult::acquired : ClaimResult::busy;
    }
    bool released = wait_until(
        deadline,
        [tag] {
          LockAcquire(tag, waiter_mode, false, false);
          LockRelease(tag, waiter_mode, false);
        },
        [] {});
    return released ? ClaimResult::released : ClaimResult::busy;
  });
}

// Whether a stored response is an error document (run_fn_storing_errors).
bool is_error_document(Datum response, bool response_is_null) {
  if (response_is_null)
    return false;
  Jsonb *document = DatumGetJsonbP(response);
  if (!JB_ROOT_IS_OBJECT(document) || JB_ROOT_COUNT(document) != 1)
    return false;
  JsonbValue error;
  if (getKeyJsonValueFromContainer(&document->root, "error", 5, &error) ==
          nullptr ||
      error.type != jbvBinary || !JsonContainerIsObject(error.val.binary.data))
    return false;
  JsonbValue sqlstate;
  return getKeyJsonValueFromContainer(error.val.binary.data, "sqlstate", 8,
                                      &sqlstate) != nullptr &&
         sqlstate.type == jbvString && sqlstate.val.string.len == 5;
}

[[noreturn]] void report_reused(const storage::KeyRef &key) {
  stats::count(stats::Event::mismatch);
  const char *shown = key_for_message(key.key);
  ereport(ERROR,
          (errcode(errcode_key_reused),
           errmsg("idempotency key \"%s\" was already used with a different "
                  "request",
                  shown),
           errdetail("A key identifies one request; its stored response "
                     "belongs to a request with another fingerprint."),
           errhint("Use a new idempotency key for a new request.")));
}

[[noreturn]] void report_recursion(const storage::KeyRef &key) {
  const char *shown = key_for_message(key.key);
  ereport(ERROR,
          (errcode(errcode_key_recursion),
           errmsg("idempotency key \"%s\" is already being processed by "
                  "this transaction",
                  shown),
           errdetail("The key was claimed earlier in this transaction and is "
                     "not yet complete: fn called idempotent_call with its "
                     "own key, or claim() was called twice.")));
}

[[noreturn]] void report_gone(const storage::KeyRef &key,
                              const storage::KeyProbe &stored) {
  stats::count(stats::Event::late_retry);
  const char *shown = key_for_message(key.key);
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
}

} // namespace

CallResult idempotent_call(const CallRequest &call) {
  // With the client's request_hash, the fingerprint is of fn and that text:
  // the same key and hash with another fn is another request.
  Statement *statement = statement_for(call.fn, call.given);
  FnArgs args = received_args(*statement, call.given);
  bytea *fingerprint =
      call.client_hash == nullptr
          ? fingerprint::request_hash(statement->fingerprint_prefix,
                                      statement->encoders, args)
          : fingerprint::client_fingerprint(call.fn, call.client_hash);
  // As this backend's last call found: a backend mostly serves one kind of
  // call in a row (new requests, or a burst of retries). A wrong guess costs
  // a second look or a claim, never a different outcome.
  static KeyExpected expected = KeyExpected::new_key;
  storage::KeyStore store = storage::key_store_for(call.key);
  TakenKey taken = take_key(store, call.key, fingerprint,
                            call.key.has_tenant ? "idempotency.tenant_call"
                                                : "idempotency.idempotent_call",
                            nullptr, expected);
  expected = taken.replay ? KeyExpected::stored : KeyExpected::new_key;
  if (taken.replay)
    return CallResult{taken.stored.response, taken.stored.response_is_null};

  bool response_is_null;
  bool is_error;
  int citus_guc_level = storage::citus::begin_fn();
  Datum response =
      run_fn_storing_errors(*statement, args, &response_is_null, &is_error);
  storage::citus::end_fn(citus_guc_level);
  storage::StoredRow times =
      store_response(store, call.key, taken, response, response_is_null);
  record_last_call(LastCall{is_error ? Outcome::stored_error : Outcome::ran,
                            true, times.created_at, times.expires_at});
  return CallResult{response, response_is_null};
}

TakenKey take_key(const storage::KeyStore &store, const storage::KeyRef &key,
                  bytea *fingerprint, const char *command, ResourceOwner owner,
                  KeyExpected expected) {
  int wait_ms = settings::wait_timeout_ms();
  TimestampTz deadline =
      wait_ms == 0
          ? 0
          : TimestampTzPlusMilliseconds(GetCurrentTimestamp(), wait_ms);
  // A key expected new is claimed first, without waiting, so that it is
  // looked up once; every outcome is still decided by a look at the key.
  Claim claim{};
  if (expected == KeyExpected::new_key && !XactReadOnly &&
      !IsInParallelMode()) {
    claim = claim_for(key, owner);
    (void)acquire(claim, 0);
  }

  // Each pass looks at the key afresh: after a wait the holder may have
  // committed (replay), rolled back (proceed), or still hold it.
  for (;;) {
    storage::KeyProbe stored =
        store.probe(key, GetCurrentTransactionStartTimestamp());
    if (stored.state == storage::KeyState::done ||
        stored.state == storage::KeyState::gone) {
      release(claim);
      if (!datum_image_eq(PointerGetDatum(stored.request_hash),
                          PointerGetDatum(fingerprint), false, -1))
        report_reused(key);
      if (stored.state == storage::KeyState::gone)
        report_gone(key, stored);
      stats::count(stats::Event::replayed);
      bool error = is_error_document(stored.response, stored.response_is_null);
      record_last_call(
          LastCall{error ? Outcome::replayed_error : Outcome::replayed, true,
                   stored.created_at, stored.expires_at});
      return TakenKey{true, stored, claim, fingerprint, {}, {}};
    }

    PreventCommandIfReadOnly(command);
    PreventCommandIfParallelMode(command);

    if (stored.state == storage::KeyState::in_progress) {
      release(claim);
      auto wait = [holder = stored.holder] {
        XactLockTableWait(holder, nullptr, nullptr, XLTW_None);
      };
      if (deadline == 0 || !wait_until(deadline, wait, [] {}))
        report_in_progress(key);
      continue;
    }

    if (claim.held)
      return TakenKey{false,       stored,          claim,
                      fingerprint, settings::ttl(), settings::remember()};

    claim = claim_for(key, owner);
    switch (acquire(claim, deadline)) {
    // Taken, the key may have been stored meanwhile: look again.
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

void report_in_progress(const storage::KeyRef &key) {
  stats::count(stats::Event::conflict);
  const char *shown = key_for_message(key.key);
  ereport(ERROR, (errcode(errcode_key_in_progress),
                  errmsg("idempotency key \"%s\" is being processed by another "
                         "transaction",
                         shown),
                  errhint("Retry the request later.")));
}

bool claimed_elsewhere(const storage::KeyRef &key) {
  return held_by_claimer(claim_for(key, nullptr).tag);
}

void release(Claim &claim) {
  if (!claim.held)
    return;
  with_owner(claim.owner,
             [&claim] { return LockRelease(&claim.tag, claim_mode, false); });
  claim.held = false;
}

char *key_for_message(const text *key) {
  const char *data = VARDATA_ANY(key);
  int size = VARSIZE_ANY_EXHDR(key);
  int from = GetDatabaseEncoding();
  int to = pg_get_client_encoding();
  // No conversion happens on the way to the client.
  if (from == to || from == PG_SQL_ASCII || to == PG_SQL_ASCII)
    return pnstrdup(data, size);
  // InvalidOid when there is none: nothing beyond ASCII converts.
  Oid proc = FindDefaultConversionProc(from, to);

  StringInfoData out;
  initStringInfo(&out);
  for (int at = 0; at < size;) {
    auto *character =
        reinterpret_cast<unsigned char *>(const_cast<char *>(data + at));
    int length = Min(pg_encoding_mblen(from, data + at), size - at);
    unsigned char converted[MAX_MULTIBYTE_CHAR_LEN * MAX_CONVERSION_GROWTH + 1];
    if (!IS_HIGHBIT_SET(*character) ||
        (OidIsValid(proc) &&
         pg_do_encoding_conversion_buf(proc, from, to, character, length,
                                       converted, sizeof(converted),
                                       true /* noError */) == length)) {
      appendBinaryStringInfo(&out, data + at, length);
    } else if (from == PG_UTF8) {
      pg_wchar code = utf8_to_unicode(character);
      appendStringInfo(&out, code <= 0xFFFF ? "\\u%04X" : "\\U%08X",
                       (unsigned)code);
    } else {
      for (int i = 0; i < length; i++)
        appendStringInfo(&out, "\\x%02X", character[i]);
    }
    at += length;
  }
  return out.data;
}

storage::StoredRow store_response(const storage::KeyStore &store,
                                  const storage::KeyRef &key, TakenKey &taken,
                                  Datum response, bool response_is_null) {
  Size bytes = response_is_null ? 0 : toast_raw_datum_size(response);
  if (bytes > settings::max_response_bytes()) {
    const char *shown = key_for_message(key.key);
    ereport(
        ERROR,
        (errcode(ERRCODE_PROGRAM_LIMIT_EXCEEDED),
         errmsg("response of idempotency key \"%s\" is %zu bytes, over "
                "idempotency.max_response_size (%zu bytes)",
                shown, (size_t)bytes, (size_t)settings::max_response_bytes()),
         errhint("Store a smaller response, or ask a superuser to raise "
                 "idempotency.max_response_size.")));
  }
  const storage::KeyProbe *replaces =
      taken.stored.state == storage::KeyState::expired ? &taken.stored
                                                       : nullptr;
  storage::StoredRow times = store.store(
      key, storage::NewRow{taken.fingerprint, response, response_is_null,
                           taken.ttl, taken.remember, replaces,
                           GetCurrentTransactionStartTimestamp()});
  stats::count(stats::Event::ran);
  // Others now see the row as in progress, except a tenant key's (its claim
  // lasts until the transaction ends), or in a subtransaction for a claim the
  // transaction holds (ROLLBACK TO would remove the row).
  if (store.row_shows_in_progress() &&
      (taken.claim.owner == nullptr || GetCurrentTransactionNestLevel() == 1))
    release(taken.claim);
  return times;
}

void clear_last_call() {
  record_last_call(LastCall{Outcome::none, false, 0, 0});
}

void record_last_call(const LastCall &call) { last = call; }

const LastCall &last_call() { return last; }

const char *outcome_name(Outcome outcome) {
  static const char *const names[] = {nullptr, "ran", "replayed",
                                      "stored_error", "replayed_error"};
  return names[static_cast<int>(outcome)];
}

} // namespace idempotency::protocol
