#include "idempotency/entry/functions.hpp"
#include "idempotency/entry/arguments.hpp"
#include "idempotency/fingerprint/key_digest.hpp"
#include "idempotency/protocol/call.hpp"
#include "idempotency/storage/secrets.hpp"

extern "C" {
#include "miscadmin.h"
}

namespace idempotency::entry {

// --- idempotent_call and tenant_call -----------------------------------------

namespace {

// After the key (and, for tenant_call, the tenant before it).
constexpr int arg_request_hash = 1;
constexpr int arg_fn = 2;
constexpr int first_fn_arg = 3;

// The key's size is checked before it is read, fn's presence before its
// arguments are collected.
protocol::CallRequest read_call(FunctionCallInfo fcinfo, Keying keying) {
  protocol::CallRequest call;
  call.key = request_key(fcinfo, keying);
  int shift = key_argno(keying);
  if (PG_ARGISNULL(shift + arg_fn))
    ereport(ERROR, (errcode(ERRCODE_NULL_VALUE_NOT_ALLOWED),
                    errmsg("fn must not be null")));
  call.fn = PG_GETARG_TEXT_PP(shift + arg_fn);
  call.given = fn_arguments(fcinfo, shift + first_fn_arg);
  call.client_hash = PG_ARGISNULL(shift + arg_request_hash)
                         ? nullptr
                         : PG_GETARG_TEXT_PP(shift + arg_request_hash);
  return call;
}

Datum call_keyed(FunctionCallInfo fcinfo, Keying keying) {
  // A call that fails on its arguments leaves no last call behind.
  protocol::clear_last_call();
  protocol::CallRequest call = read_call(fcinfo, keying);
  protocol::CallResult result = protocol::idempotent_call(call);
  if (result.is_null)
    PG_RETURN_NULL();
  return result.response;
}

} // namespace

Datum idempotent_call_body(FunctionCallInfo fcinfo) {
  return call_keyed(fcinfo, Keying::by_role);
}

Datum tenant_call_body(FunctionCallInfo fcinfo) {
  return call_keyed(fcinfo, Keying::by_tenant);
}

// --- what SQL may ask about the calling session ------------------------------

Datum current_scope_body(FunctionCallInfo) {
  return ObjectIdGetDatum(GetUserId());
}

Datum last_call_replayed_body(FunctionCallInfo fcinfo) {
  switch (protocol::last_call().outcome) {
  case protocol::Outcome::none:
    PG_RETURN_NULL();
  case protocol::Outcome::ran:
  case protocol::Outcome::stored_error:
    PG_RETURN_BOOL(false);
  case protocol::Outcome::replayed:
  case protocol::Outcome::replayed_error:
    PG_RETURN_BOOL(true);
  }
  pg_unreachable();
}

// --- keys for calls outside the database -------------------------------------

Datum derived_key_body(FunctionCallInfo fcinfo) {
  text *key = sized_text_argument(fcinfo, 0, "idempotency key");
  text *label = sized_text_argument(fcinfo, 1, "label");
  storage::DerivedKeySecret secret = storage::read_derived_key_secret();
  // The role keys are scoped to (storage::KeyRef::scope).
  text *derived = fingerprint::derived_key(secret.bytes, sizeof secret.bytes,
                                           GetUserId(), key, label);
  explicit_bzero(secret.bytes, sizeof secret.bytes);
  PG_RETURN_TEXT_P(derived);
}

} // namespace idempotency::entry
