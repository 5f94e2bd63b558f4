// The two secrets the library keys its MACs with (docs/security.md).
#pragma once

#include "idempotency/pg.hpp"

namespace idempotency::storage {

constexpr std::size_t secret_bytes = 32;

struct Secret {
  uint8 bytes[secret_bytes];
};
static_assert(std::is_trivially_destructible_v<Secret>);

// The cluster's claim secret, made on first use. The caller keys its MAC
// with it once per backend, then wipes it.
using ClaimSecret = Secret;
ClaimSecret read_claim_secret();

// The database's derived-key secret, behind idempotency.derived_key. 55000
// when the table does not exist, holds no row, more than one, or a secret
// of another size: never a key derived from no secret. The caller wipes it.
using DerivedKeySecret = Secret;
DerivedKeySecret read_derived_key_secret();

} // namespace idempotency::storage
