// The request_hash computed when the caller passes NULL: SHA-256 over fn,
// each argument's schema-qualified type name, and each argument's value.
//
// The part that depends only on fn and the argument types (the prefix) is
// computed once per statement and kept with it (protocol/statement_cache);
// a call then hashes only its values.
#pragma once

#include "fingerprint/fingerprint.hpp"

#include "fingerprint/fn_args.hpp"
#include "pg.hpp"

namespace idempotency::fingerprint {

// How an argument's value is turned into bytes: the type's binary send
// function where it has one (independent of DateStyle, extra_float_digits
// and other settings), else its text output function.
struct ValueEncoder {
  Oid function;
  bool binary;
};
static_assert(std::is_trivially_destructible_v<ValueEncoder>);

ValueEncoder encoder_for(Oid type);

// fn and the argument types, hashed.
RequestFingerprint prefix_for(text *fn, const FnArgs &args);

// The fingerprint of one call, from its statement's prefix and encoders, as
// the key table stores it (32 raw bytes).
bytea *request_hash(const RequestFingerprint &prefix,
                    const ValueEncoder *encoders, const FnArgs &args);

// The fingerprint of a request whose client passed its own hash: `framed`
// (fn, or the claim marker) and the client's text.
bytea *client_fingerprint(RequestFingerprint framed, text *client_hash);

// What a row stored before version 0.3 holds for the same client text.
bytea *legacy_client_fingerprint(const text *client_hash);

bytea *as_bytea(const Fingerprint &fingerprint);

} // namespace idempotency::fingerprint
