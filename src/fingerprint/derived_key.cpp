#include "idempotency/fingerprint/fingerprint.hpp"

#include "idempotency/fingerprint/derived_key.hpp"
#include "idempotency/fingerprint/key_digest.hpp"

extern "C" {
#include "utils/builtins.h"
}

namespace idempotency::fingerprint {

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
  uint8 header[1 + 8];
  header[0] = utf8 != nullptr ? utf8_tag : unconverted_tag;
  uint64 length = field_size;
  for (int i = 0; i < 8; i++) {
    header[1 + i] = static_cast<uint8>(length);
    length >>= 8;
  }
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
