#include "idempotency/fingerprint/fingerprint.hpp"

#include "idempotency/fingerprint/key_digest.hpp"

extern "C" {
#include "catalog/pg_conversion.h"
#include "catalog/pg_namespace.h"
#include "mb/pg_wchar.h"
#include "port/pg_bswap.h"
#include "utils/builtins.h"
#include "utils/memutils.h"
#include "utils/uuid.h"
}

namespace idempotency::fingerprint {

namespace {

// SQL_ASCII declares no encoding, so its bytes are taken as they are.
bool bytes_are_canonical(const char *bytes, Size size) {
  int encoding = GetDatabaseEncoding();
  if (encoding == PG_UTF8 || encoding == PG_SQL_ASCII)
    return true;
  for (Size i = 0; i < size; i++)
    if (IS_HIGHBIT_SET(bytes[i]))
      return false;
  return true;
}

// data is nullptr, size the text's, when the text has no UTF-8 form (a
// character Unicode lacks). A conversion stays in the current memory context.
struct Utf8 {
  const char *data;
  Size size;
};
static_assert(std::is_trivially_destructible_v<Utf8>);

Utf8 utf8_form(const char *bytes, Size size) {
  if (bytes_are_canonical(bytes, size))
    return {bytes, size};
  // From pg_catalog only (a user's default conversion must not change which
  // key a text names), once per backend: its encoding never changes.
  static bool looked_up = false;
  static Oid proc = InvalidOid; // InvalidOid: there is none
  if (!looked_up) {
    proc = FindDefaultConversion(PG_CATALOG_NAMESPACE, GetDatabaseEncoding(),
                                 PG_UTF8);
    looked_up = true;
  }
  if (!OidIsValid(proc))
    return {nullptr, size};
  // Only idempotency.key_digest(text) meets a text this long.
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
  if (static_cast<Size>(converted) != size)
    return {nullptr, size};
  const char *data = reinterpret_cast<const char *>(utf8);
  return {data, strlen(data)};
}

// claim() and complete() of one message digest one key; comparing is cheaper.
struct LastDigest {
  bool valid;
  Size key_size;
  char key[128];
  OrderedKeyDigest digest;
};
LastDigest last_digest{};

} // namespace

// A bytea is laid out as a text.
bytea *as_bytea(const void *bytes, Size size) {
  return reinterpret_cast<bytea *>(cstring_to_text_with_len(
      static_cast<const char *>(bytes), static_cast<int>(size)));
}

Size utf8_length(const char *bytes, Size size) {
  return utf8_form(bytes, size).size;
}

bytea *digest_of_key(const text *key) {
  const char *bytes = VARDATA_ANY(key);
  Size size = VARSIZE_ANY_EXHDR(key);
  if (last_digest.valid && last_digest.key_size == size &&
      memcmp(last_digest.key, bytes, size) == 0)
    return as_bytea(last_digest.digest.bytes, last_digest.digest.size);
  Utf8 utf8 = utf8_form(bytes, size);
  // A key with no UTF-8 form has one digest in both tables.
  if (utf8.data == nullptr)
    return tenant_digest_of_key(key);
  OrderedKeyDigest digest;
  ordered_key_digest(utf8.data, utf8.size, digest);
  last_digest.valid = size <= sizeof last_digest.key;
  if (last_digest.valid) {
    memcpy(last_digest.key, bytes, size);
    last_digest.key_size = size;
    last_digest.digest = digest;
  }
  return as_bytea(digest.bytes, digest.size);
}

bytea *tenant_digest_of_key(const text *key) {
  uint8 digest[key_digest_size];
  Utf8 utf8 = utf8_form(VARDATA_ANY(key), VARSIZE_ANY_EXHDR(key));
  if (utf8.data == nullptr)
    unconverted_key_digest(VARDATA_ANY(key), utf8.size, digest);
  else
    key_digest(utf8.data, utf8.size, digest);
  return as_bytea(digest, key_digest_size);
}

namespace {

// The domain of these MACs: no other message of the extension starts so.
constexpr char derivation_tag[] = "idempotency derived-key v1";

constexpr uint8 tag_key_utf8 = 0x01;
constexpr uint8 tag_key_unconverted = 0x02;
constexpr uint8 tag_label_utf8 = 0x03;
constexpr uint8 tag_label_unconverted = 0x04;

// As UTF-8 where it has that form: a restore into another encoding agrees.
void update_with_text(HmacSha256 &mac, const text *value, uint8 utf8_tag,
                      uint8 unconverted_tag) {
  Utf8 utf8 = utf8_form(VARDATA_ANY(value), VARSIZE_ANY_EXHDR(value));
  const char *field = utf8.data != nullptr ? utf8.data : VARDATA_ANY(value);
  uint8 header[1 + 8] = {utf8.data != nullptr ? utf8_tag : unconverted_tag};
  for (int i = 0; i < 8; i++)
    header[1 + i] = static_cast<uint8>(uint64{utf8.size} >> (8 * i));
  mac.update(header, sizeof header);
  mac.update(field, utf8.size);
}

} // namespace

text *derived_key(const uint8 *secret, std::size_t secret_size, Oid role,
                  const text *key, const text *label) {
  HmacSha256 mac(secret, secret_size);
  mac.update(derivation_tag, sizeof derivation_tag - 1);
  uint32 role_bytes = pg_hton32(role);
  mac.update(&role_bytes, sizeof role_bytes);
  update_with_text(mac, key, tag_key_utf8, tag_key_unconverted);
  update_with_text(mac, label, tag_label_utf8, tag_label_unconverted);
  uint8 digest[HmacSha256::mac_size];
  mac.finish(digest);
  // RFC 9562: version 8, variant 10.
  digest[6] = static_cast<uint8>((digest[6] & 0x0F) | 0x80);
  digest[8] = static_cast<uint8>((digest[8] & 0x3F) | 0x80);
  pg_uuid_t uuid;
  memcpy(uuid.data, digest, UUID_LEN);
  explicit_bzero(digest, sizeof digest);
  return cstring_to_text(
      DatumGetCString(DirectFunctionCall1(uuid_out, UUIDPGetDatum(&uuid))));
}

} // namespace idempotency::fingerprint
