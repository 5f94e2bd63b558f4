// The two secrets the library keys its MACs with (docs/security.md).
#pragma once

#include "idempotency/pg.hpp"

namespace idempotency::storage {

constexpr std::size_t claim_secret_bytes = 32;

struct ClaimSecret {
  uint8 bytes[claim_secret_bytes];
};
static_assert(std::is_trivially_destructible_v<ClaimSecret>);

// The cluster's claim secret, made on first use. The caller keys its MAC
// with it once per backend, then wipes it.
ClaimSecret read_claim_secret();

constexpr std::size_t derived_key_secret_bytes = 32;

struct DerivedKeySecret {
  uint8 bytes[derived_key_secret_bytes];
};
static_assert(std::is_trivially_destructible_v<DerivedKeySecret>);

// The database's derived-key secret, behind idempotency.derived_key. 55000
// when the table does not exist, holds no row, more than one, or a secret
// of another size: never a key derived from no secret. The caller wipes it.
DerivedKeySecret read_derived_key_secret();

} // namespace idempotency::storage
