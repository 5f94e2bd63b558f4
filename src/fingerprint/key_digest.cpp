#include "fingerprint/fingerprint.hpp"

#include "fingerprint/key_digest.hpp"

namespace idempotency::fingerprint {

bytea *digest_of_key(const text *key) {
  bytea *digest = static_cast<bytea *>(palloc(VARHDRSZ + key_digest_size));
  SET_VARSIZE(digest, VARHDRSZ + key_digest_size);
  uint8 bytes[key_digest_size];
  key_digest(VARDATA_ANY(key), VARSIZE_ANY_EXHDR(key), bytes);
  memcpy(VARDATA(digest), bytes, key_digest_size);
  return digest;
}

Datum key_digest_body(FunctionCallInfo fcinfo) {
  PG_RETURN_BYTEA_P(digest_of_key(PG_GETARG_TEXT_PP(0)));
}

} // namespace idempotency::fingerprint
