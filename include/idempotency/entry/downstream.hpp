// Keys for the calls a request's handler makes outside the database
// (docs/downstream.md).
#pragma once

#include "idempotency/pg.hpp"

namespace idempotency::entry {

// Body of idempotency.derived_key(key, label): the key derived for the
// current role from `key` and `label` with the database's derived-key
// secret (fingerprint/derived_key.hpp). Key and label are checked like a
// call's key: 22004 when NULL, 22023 when empty or over 255 bytes.
Datum derived_key_body(FunctionCallInfo fcinfo);

} // namespace idempotency::entry
