#include "idempotency/fingerprint/request_hash.hpp"

#include <algorithm>

#include "idempotency/protocol/app_api.hpp"
#include "idempotency/boundary/sqlstates.hpp"
#include "idempotency/boundary/subtransaction.hpp"
#include "idempotency/protocol/call.hpp"

extern "C" {
#include "miscadmin.h"
#include "utils/datum.h"
#include "utils/lsyscache.h"
#include "utils/memutils.h"
}

namespace idempotency::protocol {

namespace {

// In TopTransactionContext.
struct HeldKey {
  storage::KeyRef key;
  TakenKey taken; // its claim owned by the transaction's resource owner
  bool completed;
  // Numbered as they start: rolling back S undoes subtransactions >= S.
  SubTransactionId claimed_in;
  SubTransactionId completed_in;
  HeldKey *next;
};

HeldKey *held_keys = nullptr; // this transaction's, newest first

HeldKey *find_held(const storage::KeyRef &key) {
  for (HeldKey *held = held_keys; held != nullptr; held = held->next) {
    const storage::KeyRef &a = held->key;
    if (a.scope != key.scope || a.has_tenant != key.has_tenant ||
        !datum_image_eq(PointerGetDatum(a.key), PointerGetDatum(key.key), false,
                        -1))
      continue;
    if (!a.has_tenant)
      return held;
    int16 length;
    bool by_value;
    get_typlenbyval(a.tenant_type, &length, &by_value);
    if (a.tenant_type == key.tenant_type &&
        datumIsEqual(a.tenant, key.tenant, by_value, length))
      return held;
  }
  return nullptr;
}

HeldKey &claimed_key(const storage::KeyRef &key, const char *command) {
  HeldKey *held = find_held(key);
  if (held != nullptr && !held->completed)
    return *held;
  const char *shown = key_for_message(key.key);
  if (held == nullptr)
    ereport(ERROR,
            (errcode(ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE),
             errmsg("idempotency key \"%s\" is not claimed by this transaction",
                    shown),
             errdetail("%s needs a key that idempotency.claim() returned with "
                       "replayed = false in this transaction, not yet "
                       "completed or released.",
                       command),
             errhint("Call idempotency.claim(key, request_hash) first, in the "
                     "same transaction.")));
  ereport(ERROR, (errcode(ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE),
                  errmsg("idempotency key \"%s\" is already completed in "
                         "this transaction",
                         shown),
                  errdetail("Its response is stored; it commits or rolls "
                            "back with the transaction.")));
}

// The transaction must not end holding an unfinished claim: its work would
// commit without the response that makes a retry replay it.
void check_no_unfinished_claims(const char *ending) {
  for (HeldKey *held = held_keys; held != nullptr; held = held->next) {
    if (held->completed)
      continue;
    const char *shown = key_for_message(held->key.key);
    ereport(ERROR,
            (errcode(ERRCODE_INVALID_TRANSACTION_STATE),
             errmsg("cannot %s a transaction that holds idempotency key "
                    "\"%s\" without completing it",
                    ending, shown),
             errdetail("The transaction claimed the key with "
                       "idempotency.claim() and neither completed nor "
                       "released it; it has been rolled back."),
             errhint("Call idempotency.complete(key, response) to store the "
                     "response, or idempotency.release(key) to let go of "
                     "the key, before COMMIT.")));
  }
}

} // namespace

ClaimRow claim_key(const storage::KeyRef &key, text *client_hash) {
  // With the claim marker, so a claim never matches an idempotent_call.
  bytea *fingerprint = fingerprint::client_fingerprint(nullptr, client_hash);
  // claim() serves queue consumers, whose keys are mostly new.
  storage::KeyStore store = storage::key_store_for(key);
  TakenKey taken = take_key(store, key, fingerprint,
                            key.has_tenant ? "idempotency.tenant_claim"
                                           : "idempotency.claim",
                            TopTransactionResourceOwner, KeyExpected::new_key);
  const storage::KeyProbe &stored = taken.stored;
  if (taken.replay)
    return ClaimRow{true, stored.response,   stored.response_is_null,
                    true, stored.created_at, stored.expires_at};
  MemoryContext caller = MemoryContextSwitchTo(TopTransactionContext);
  auto *held = static_cast<HeldKey *>(palloc0(sizeof(HeldKey)));
  held->key = key;
  held->key.key = DatumGetTextPCopy(PointerGetDatum(key.key));
  held->key.digest = DatumGetByteaPCopy(PointerGetDatum(key.digest));
  if (key.has_tenant) {
    int16 length;
    bool by_value;
    get_typlenbyval(key.tenant_type, &length, &by_value);
    held->key.tenant = datumCopy(key.tenant, by_value, length);
  }
  held->taken = taken;
  held->taken.fingerprint = DatumGetByteaPCopy(PointerGetDatum(fingerprint));
  held->claimed_in = GetCurrentSubTransactionId();
  held->next = held_keys;
  held_keys = held;
  MemoryContextSwitchTo(caller);
  record_last_call(LastCall{Outcome::ran, false, 0, 0});
  return ClaimRow{false, (Datum)0, true, false, 0, 0};
}

void complete_key(const storage::KeyRef &key, Datum response,
                  bool response_is_null) {
  HeldKey &held = claimed_key(key, "idempotency.complete()");
  store_response(storage::key_store_for(key), key, held.taken, response,
                 response_is_null);
  held.completed = true;
  held.completed_in = GetCurrentSubTransactionId();
}

void release_key(const storage::KeyRef &key) {
  HeldKey &held = claimed_key(key, "idempotency.release()");
  release(held.taken.claim);
  for (HeldKey **link = &held_keys; *link != nullptr; link = &(*link)->next)
    if (*link == &held) {
      *link = held.next;
      return;
    }
}

LookupRow lookup_key(const storage::KeyRef &key) {
  storage::KeyProbe stored = storage::key_store_for(key).probe(
      key, GetCurrentTransactionStartTimestamp());
  HeldKey *held = find_held(key);
  LookupState state = LookupState::in_progress;
  if (stored.state == storage::KeyState::done)
    state = LookupState::done;
  else if (stored.state == storage::KeyState::gone)
    state = LookupState::gone;
  // A claimed key has no new row until it is completed.
  else if (stored.state != storage::KeyState::in_progress && held == nullptr &&
           !claimed_elsewhere(key))
    state = stored.state == storage::KeyState::expired ? LookupState::expired
                                                       : LookupState::absent;
  if (held != nullptr && !held->completed)
    state = LookupState::in_progress;
  bool done = state == LookupState::done;
  bool has_times =
      done || state == LookupState::gone || state == LookupState::expired;
  return LookupRow{state,
                   has_times,
                   has_times ? stored.created_at : 0,
                   has_times ? stored.expires_at : 0,
                   done ? stored.response : (Datum)0,
                   !done || stored.response_is_null};
}

bool forget_key(const storage::KeyRef &key) {
  PreventCommandIfReadOnly("idempotency.forget");
  if (find_held(key) != nullptr) {
    const char *shown = key_for_message(key.key);
    ereport(
        ERROR,
        (errcode(ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE),
         errmsg("idempotency key \"%s\" is claimed by this transaction", shown),
         errhint("Release it, or forget it in a later transaction.")));
  }
  storage::KeyStore store = storage::key_store_for(key);
  storage::KeyProbe stored =
      store.probe(key, GetCurrentTransactionStartTimestamp());
  if (stored.state == storage::KeyState::done ||
      stored.state == storage::KeyState::gone)
    return store.remove(key, stored);
  if (stored.state == storage::KeyState::in_progress || claimed_elsewhere(key))
    report_in_progress(key);
  return false;
}

void claim_batch(const storage::KeyRef *keys, text *const *client_hashes,
                 int count, BatchAnswer *answers) {
  clear_last_call();
  int *order = static_cast<int *>(palloc(sizeof(int) * Max(count, 1)));
  for (int i = 0; i < count; i++)
    order[i] = i;
  std::stable_sort(order, order + count, [keys](int a, int b) {
    const varlena *x = keys[a].digest;
    const varlena *y = keys[b].digest;
    Size x_size = VARSIZE_ANY_EXHDR(x);
    Size y_size = VARSIZE_ANY_EXHDR(y);
    int by_digest = memcmp(VARDATA_ANY(x), VARDATA_ANY(y), Min(x_size, y_size));
    return by_digest != 0 ? by_digest < 0 : x_size < y_size;
  });
  for (int n = 0; n < count; n++) {
    int i = order[n];
    BatchAnswer *answer = &answers[i];
    run_in_subtransaction(
        [answer, key = &keys[i], hash = client_hashes[i]] {
          answer->row = claim_key(*key, hash);
          answer->outcome = answer->row.replayed ? BatchOutcome::replayed
                                                 : BatchOutcome::claimed;
        },
        [answer](const ErrorData *error) {
          if (!is_key_answer(error->sqlerrcode))
            return false;
          answer->outcome = BatchOutcome::refused;
          answer->sqlerrcode = error->sqlerrcode;
          answer->message = pstrdup(error->message);
          return true;
        });
  }
  clear_last_call();
}

const char *lookup_state_name(LookupState state) {
  static const char *const names[] = {"absent", "in_progress", "done",
                                      "expired", "gone"};
  return names[static_cast<int>(state)];
}

namespace claims {

void at_pre_commit() { check_no_unfinished_claims("commit"); }

void at_pre_prepare() { check_no_unfinished_claims("prepare"); }

// The claim locks go with the transaction's resource owner.
void at_transaction_end() { held_keys = nullptr; }

// Undoes claims and completions made after the savepoint.
void at_subtransaction_abort(SubTransactionId aborted) {
  HeldKey **link = &held_keys;
  while (*link != nullptr) {
    HeldKey *held = *link;
    if (held->claimed_in >= aborted) {
      release(held->taken.claim);
      *link = held->next;
      continue;
    }
    if (held->completed && held->completed_in >= aborted)
      held->completed = false;
    link = &held->next;
  }
}

} // namespace claims

} // namespace idempotency::protocol
