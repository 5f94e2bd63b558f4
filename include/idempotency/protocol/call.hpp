// The call protocol of idempotency.idempotent_call (and tenant_call): look
// the key up, claim it, run fn, store the response - all in the caller's
// transaction.
#pragma once

#include "idempotency/fingerprint/fn_args.hpp"
#include "idempotency/pg.hpp"
#include "idempotency/storage/key_store.hpp"

namespace idempotency::protocol {

// A call, its SQL arguments read and checked (entry/calls).
struct CallRequest {
  storage::KeyRef key; // a tenant key for tenant_call (key.has_tenant)
  text *fn;
  text *client_hash; // the caller's request_hash; nullptr: none given
  FnArgs given;      // fn's arguments, with the types the caller gave them
};
static_assert(std::is_trivially_destructible_v<CallRequest>);

// The response: the one fn returned and stored now, or the stored one.
struct CallResult {
  Datum response;
  bool is_null;
};

// The caller has cleared the session's last call (protocol/outcome.hpp)
// before reading the arguments: a call that fails on them has none.
CallResult idempotent_call(const CallRequest &call);

} // namespace idempotency::protocol
