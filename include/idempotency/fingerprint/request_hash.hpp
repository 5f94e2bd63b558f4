// Request fingerprints as the key table stores them (32 raw bytes).
//
// When the caller passes NULL for request_hash: SHA-256 over fn, the type of
// each value fn receives (schema-qualified name) and each value. When the
// caller passes its own text: SHA-256 over fn (or the claim marker) and that
// text. Text inside a fingerprint - fn, type names, text values, the client's
// text - is hashed as UTF-8 whatever the database encoding, so a dump
// restored into a database of another encoding keeps every fingerprint.
//
// The part that depends only on fn and the types (the prefix) is computed
// once per statement and kept with it (protocol/fn); a call
// then hashes only its values.
#pragma once

#include "idempotency/fingerprint/fingerprint.hpp"

#include "idempotency/fingerprint/fn_args.hpp"
#include "idempotency/pg.hpp"

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

// fn and the types, hashed.
RequestFingerprint prefix_for(text *fn, int nargs, const Oid *types);

// The fingerprint of one call, from its statement's prefix and encoders.
bytea *request_hash(const RequestFingerprint &prefix,
                    const ValueEncoder *encoders, const FnArgs &args);

// A request whose client passed its own hash, framed by fn (or, with fn
// nullptr, by the claim marker of the application API). A client_hash of
// nullptr is framed as NULL.
bytea *client_fingerprint(text *fn, text *client_hash);

} // namespace idempotency::fingerprint
