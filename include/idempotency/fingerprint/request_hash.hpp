// Request fingerprints as the key table stores them (32 raw bytes): SHA-256
// over fn, each value's type (schema-qualified) and each value, or over fn
// (or the claim marker) and the client's own hash. Text in a fingerprint is
// hashed as UTF-8 whatever the database encoding, so a dump restored into a
// database of another encoding keeps every fingerprint.
#pragma once

#include "idempotency/fingerprint/fingerprint.hpp"

#include "idempotency/fingerprint/fn_args.hpp"
#include "idempotency/pg.hpp"

namespace idempotency::fingerprint {

// The type's binary send function where it has one (independent of
// DateStyle, extra_float_digits and other settings), else its output
// function.
struct ValueEncoder {
  Oid function;
  bool binary;
};
static_assert(std::is_trivially_destructible_v<ValueEncoder>);

ValueEncoder encoder_for(Oid type);

// fn and the types, computed once per statement (protocol/fn).
RequestFingerprint prefix_for(text *fn, int nargs, const Oid *types);

bytea *request_hash(const RequestFingerprint &prefix,
                    const ValueEncoder *encoders, const FnArgs &args);

// Framed by fn, or with fn nullptr by the claim marker; a client_hash of
// nullptr is framed as NULL.
bytea *client_fingerprint(text *fn, text *client_hash);

} // namespace idempotency::fingerprint
