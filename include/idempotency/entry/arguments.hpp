// Reading the SQL functions' arguments: the key, for the tenant_* functions
// the tenant before it, and the arguments passed on to fn.
#pragma once

#include "idempotency/fingerprint/fn_args.hpp"
#include "idempotency/pg.hpp"
#include "idempotency/storage/key_store.hpp"

namespace idempotency::entry {

// How an SQL function names its key: by key alone (idempotency.keys), or by
// tenant and key, the tenant first (the tenant_* functions, whose keys live
// in idempotency.tenant_keys). The arguments after the key shift by one.
enum class Keying { by_role, by_tenant };

constexpr int key_argno(Keying keying) {
  return keying == Keying::by_tenant ? 1 : 0;
}

// The key of a call, read as `keying` says, with the digest its table
// holds: 22004 when NULL, 22023 when empty or over max_key_bytes (as
// sized_text counts them); for
// tenant keys also the tenant (22004 when NULL, 42804 when its type is
// unknown).
storage::KeyRef request_key(FunctionCallInfo fcinfo, Keying keying);

// A text value sized like a key: 22004 when is_null, 22023 when empty or
// its UTF-8 form over max_key_bytes, whatever the database encoding (a
// value too long in every encoding is refused before it is read); `what`
// names it in the messages.
text *sized_text(Datum value, bool is_null, const char *what);

// A role key given as a value (an element of claim_batch's keys), checked
// as sized_text checks it, with the digest its table holds.
storage::KeyRef role_key(Datum value, bool is_null);

// Text argument `argno` sized like a key - a key, or derived_key's label:
// checked as sized_text checks it; `what` names it in the messages
// ("idempotency key").
text *sized_text_argument(FunctionCallInfo fcinfo, int argno, const char *what);

// The arguments after the first `first` ones, as bound to $1 ... $n. Handles
// both a spread VARIADIC "any" list and an explicit VARIADIC array; an
// untyped literal ('abc') binds as text.
FnArgs fn_arguments(FunctionCallInfo fcinfo, int first);

} // namespace idempotency::entry
