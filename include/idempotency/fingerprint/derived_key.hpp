// Derived keys: the key of a call a request's handler makes downstream (a
// payment provider's Idempotency-Key, an email's message id, an outbox
// row's key), derived from the request's own key so that every retry of the
// request derives the same one (docs/downstream.md).
//
// The derived key is HMAC-SHA256 keyed with the database's derived-key
// secret (storage/derived_key_secret.hpp) over
//   "idempotency derived-key v1", then the role's OID (4 bytes,
//   big-endian), then the key, then the label, the key and the label each
//   as a tag (UTF-8 or database encoding) and a length (8 bytes,
//   little-endian) before its bytes,
// so that no two (role, key, label) share a message, whatever their bytes
// ("ab","c" and "a","bc" differ). Key and label are taken in UTF-8 whatever
// the database encoding (fingerprint/key_digest.hpp), so a restore into a
// database of another encoding derives the same keys; text that has no
// UTF-8 form is taken as it is, under another tag.
//
// Its text is the MAC's first 16 bytes as a UUID of version 8 (RFC 9562's
// version for custom layouts): 36 characters of [0-9a-f-], 122 bits of the
// MAC, that providers that want a UUID accept, as every HTTP header, URL and
// e-mail address does, and that fits their limits (Stripe's 255, AWS's 64,
// Square's 45). Without the secret, no one can tell one from a random UUID
// or compute another role's.
#pragma once

#include "idempotency/pg.hpp"

namespace idempotency::fingerprint {

constexpr std::size_t derived_key_size = 36;

// The derived key's text, in the current memory context. The secret is 32
// bytes.
text *derived_key(const uint8 *secret, std::size_t secret_size, Oid role,
                  const text *key, const text *label);

} // namespace idempotency::fingerprint
