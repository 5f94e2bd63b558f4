#include "idempotency/fingerprint/fingerprint.hpp"

#include "idempotency/fingerprint/key_digest.hpp"

extern "C" {
#include "catalog/pg_conversion.h"
#include "catalog/pg_namespace.h"
#include "mb/pg_wchar.h"
#include "utils/builtins.h"
#include "utils/memutils.h"
}

namespace idempotency::fingerprint {

// --- a key's UTF-8 form and digests ------------------------------------------

namespace {

// The database encoding's default conversion to UTF-8, from pg_catalog only:
// a conversion that a user declares default in a schema of the search_path
// must not change which key a text names. Looked up once per backend, whose
// database, hence encoding, never changes.
Oid conversion_to_utf8() {
  static bool looked_up = false;
  static Oid proc = InvalidOid; // InvalidOid: there is none
  if (!looked_up) {
    proc = FindDefaultConversion(PG_CATALOG_NAMESPACE, GetDatabaseEncoding(),
                                 PG_UTF8);
    looked_up = true;
  }
  return proc;
}

// The bytes already are the key's UTF-8 form: in a UTF8 database; in an
// SQL_ASCII one, which declares no encoding, so the bytes are taken as they
// are (UTF-8 text there digests as it would in a UTF8 database); and for an
// ASCII key, the same bytes in every server encoding.
bool bytes_are_canonical(const char *bytes, Size size) {
  int encoding = GetDatabaseEncoding();
  if (encoding == PG_UTF8 || encoding == PG_SQL_ASCII)
    return true;
  for (Size i = 0; i < size; i++)
    if (IS_HIGHBIT_SET(bytes[i]))
      return false;
  return true;
}

// The UTF-8 form of `size` bytes of text in the database encoding: the
// bytes themselves where they already are, else a palloc'd conversion,
// `*owned` set and `*utf8_size` its length; nullptr when the text has no
// UTF-8 form (a character of the database encoding that Unicode lacks).
const char *utf8_form(const char *bytes, Size size, bool *owned,
                      Size *utf8_size) {
  *owned = false;
  *utf8_size = size;
  if (bytes_are_canonical(bytes, size))
    return bytes;
  Oid proc = conversion_to_utf8();
  if (!OidIsValid(proc))
    return nullptr;
  // Only idempotency.key_digest(text) meets a text this long: a key's
  // length is limited far below.
  if (size >= (MaxAllocSize - 1) / MAX_CONVERSION_GROWTH)
    ereport(ERROR, (errcode(ERRCODE_PROGRAM_LIMIT_EXCEEDED),
                    errmsg("text of %zu bytes is too long for a key digest",
                           (size_t)size)));
  Size room = size * MAX_CONVERSION_GROWTH + 1;
  unsigned char *utf8 = static_cast<unsigned char *>(palloc(room));
  int converted = pg_do_encoding_conversion_buf(
      proc, GetDatabaseEncoding(), PG_UTF8,
      reinterpret_cast<unsigned char *>(const_cast<char *>(bytes)),
      static_cast<int>(size), utf8, static_cast<int>(room), true /* noError */);
  if (static_cast<Size>(converted) != size) {
    pfree(utf8);
    return nullptr;
  }
  *owned = true;
  *utf8_size = strlen(reinterpret_cast<const char *>(utf8));
  return reinterpret_cast<const char *>(utf8);
}

// The last key digested and its digest: claim() and complete() of one
// message digest the same key, and a digest costs more than comparing the
// key. It depends only on the key's bytes, the database encoding being the
// backend's for its life. Longer keys are not kept.
struct LastDigest {
  bool valid;
  Size key_size;
  char key[128];
  OrderedKeyDigest digest;
};
LastDigest last_digest{};

} // namespace

bytea *as_bytea(const void *bytes, Size size) {
  bytea *value = static_cast<bytea *>(palloc(VARHDRSZ + size));
  SET_VARSIZE(value, VARHDRSZ + size);
  memcpy(VARDATA(value), bytes, size);
  return value;
}

Size utf8_length(const char *bytes, Size size) {
  bool owned;
  Size utf8_size;
  const char *utf8 = utf8_form(bytes, size, &owned, &utf8_size);
  if (utf8 == nullptr)
    return size;
  if (owned)
    pfree(const_cast<char *>(utf8));
  return utf8_size;
}

bytea *digest_of_key(const text *key) {
  const char *bytes = VARDATA_ANY(key);
  Size size = VARSIZE_ANY_EXHDR(key);
  if (last_digest.valid && last_digest.key_size == size &&
      memcmp(last_digest.key, bytes, size) == 0)
    return as_bytea(last_digest.digest.bytes, last_digest.digest.size);
  bool owned;
  Size utf8_size;
  const char *utf8 = utf8_form(bytes, size, &owned, &utf8_size);
  if (utf8 == nullptr) {
    uint8 digest_bytes[key_digest_size];
    unconverted_key_digest(bytes, size, digest_bytes);
    return as_bytea(digest_bytes, key_digest_size);
  }
  OrderedKeyDigest digest;
  ordered_key_digest(utf8, utf8_size, digest);
  if (owned)
    pfree(const_cast<char *>(utf8));
  last_digest.valid = size <= sizeof last_digest.key;
  if (last_digest.valid) {
    memcpy(last_digest.key, bytes, size);
    last_digest.key_size = size;
    last_digest.digest = digest;
  }
  return as_bytea(digest.bytes, digest.size);
}

// A key that has no UTF-8 form is digested over its own bytes, marked
// (fingerprint::unconverted_key_digest).
bytea *tenant_digest_of_key(const text *key) {
  const char *bytes = VARDATA_ANY(key);
  Size size = VARSIZE_ANY_EXHDR(key);
  uint8 digest[key_digest_size];
  bool owned;
  Size utf8_size;
  const char *utf8 = utf8_form(bytes, size, &owned, &utf8_size);
  if (utf8 == nullptr) {
    unconverted_key_digest(bytes, size, digest);
  } else {
    key_digest(utf8, utf8_size, digest);
    if (owned)
      pfree(const_cast<char *>(utf8));
  }
  return as_bytea(digest, key_digest_size);
}

// --- derived keys: a key's keyed digest, for calls downstream ----------------

namespace {

// The domain of these MACs: no other message of the extension starts so.
constexpr char derivation_tag[] = "idempotency derived-key v1";

constexpr uint8 tag_key_utf8 = 0x01;
constexpr uint8 tag_key_unconverted = 0x02;
constexpr uint8 tag_label_utf8 = 0x03;
constexpr uint8 tag_label_unconverted = 0x04;

// A tag, the length (8 bytes, little-endian), then the text's bytes: in
// UTF-8, or as they are when the text has none.
void update_with_text(HmacSha256 &mac, const text *value, uint8 utf8_tag,
                      uint8 unconverted_tag) {
  const char *bytes = VARDATA_ANY(value);
  Size size = VARSIZE_ANY_EXHDR(value);
  bool owned;
  Size utf8_size;
  const char *utf8 = utf8_form(bytes, size, &owned, &utf8_size);
  const char *field = utf8 != nullptr ? utf8 : bytes;
  Size field_size = utf8 != nullptr ? utf8_size : size;
  uint8 header[1 + 8] = {utf8 != nullptr ? utf8_tag : unconverted_tag};
  for (int i = 0; i < 8; i++)
    header[1 + i] = static_cast<uint8>(uint64{field_size} >> (8 * i));
  mac.update(header, sizeof header);
  mac.update(field, field_size);
  if (owned)
    pfree(const_cast<char *>(utf8));
}

} // namespace

text *derived_key(const uint8 *secret, std::size_t secret_size, Oid role,
                  const text *key, const text *label) {
  HmacSha256 mac(secret, secret_size);
  mac.update(derivation_tag, sizeof derivation_tag - 1);
  const uint8 role_bytes[4] = {
      static_cast<uint8>(role >> 24), static_cast<uint8>(role >> 16),
      static_cast<uint8>(role >> 8), static_cast<uint8>(role)};
  mac.update(role_bytes, sizeof role_bytes);
  update_with_text(mac, key, tag_key_utf8, tag_key_unconverted);
  update_with_text(mac, label, tag_label_utf8, tag_label_unconverted);
  uint8 digest[HmacSha256::mac_size];
  mac.finish(digest);

  // RFC 9562: version 8 in the high nibble of byte 6, variant 10 in the
  // high bits of byte 8.
  digest[6] = static_cast<uint8>((digest[6] & 0x0F) | 0x80);
  digest[8] = static_cast<uint8>((digest[8] & 0x3F) | 0x80);
  static const char hex[] = "0123456789abcdef";
  char out[derived_key_size];
  std::size_t at = 0;
  for (int i = 0; i < 16; i++) {
    if (i == 4 || i == 6 || i == 8 || i == 10)
      out[at++] = '-';
    out[at++] = hex[digest[i] >> 4];
    out[at++] = hex[digest[i] & 0x0F];
  }
  explicit_bzero(digest, sizeof digest);
  return cstring_to_text_with_len(out, static_cast<int>(derived_key_size));
}

} // namespace idempotency::fingerprint
