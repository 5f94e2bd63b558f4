#include "idempotency/entry/downstream.hpp"

#include "idempotency/entry/arguments.hpp"
#include "idempotency/fingerprint/derived_key.hpp"
#include "idempotency/storage/derived_key_secret.hpp"

extern "C" {
#include "miscadmin.h"
}

namespace idempotency::entry {

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
