// Request fingerprints. Text is hashed as UTF-8 whatever the database
// encoding, so a dump restored into another encoding keeps them.
#pragma once

#include "idempotency/fingerprint/fingerprint.hpp"

#include "idempotency/fingerprint/fn_args.hpp"
#include "idempotency/pg.hpp"

namespace idempotency::fingerprint {

// The send function if any, which no setting (DateStyle, ...) alters.
struct ValueEncoder {
  Oid function;
  bool binary;
};
static_assert(std::is_trivially_destructible_v<ValueEncoder>);

ValueEncoder encoder_for(Oid type);

RequestFingerprint prefix_for(text *fn, int nargs, const Oid *types);

bytea *request_hash(const RequestFingerprint &prefix,
                    const ValueEncoder *encoders, const FnArgs &args);

// fn nullptr: the claim marker; client_hash nullptr: NULL.
bytea *client_fingerprint(text *fn, text *client_hash);

} // namespace idempotency::fingerprint
