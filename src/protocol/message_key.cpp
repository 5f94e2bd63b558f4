#include "idempotency/protocol/message_key.hpp"

extern "C" {
#include "catalog/namespace.h"
#include "lib/stringinfo.h"
#include "mb/pg_wchar.h"
}

namespace idempotency::protocol {

namespace {

struct Conversion {
  int from;
  int to;
  Oid proc; // InvalidOid: none, so nothing beyond ASCII converts
};

bool converts(const Conversion &conversion, const char *character, int length) {
  if (!OidIsValid(conversion.proc))
    return false;
  unsigned char converted[MAX_MULTIBYTE_CHAR_LEN * MAX_CONVERSION_GROWTH + 1];
  int done = pg_do_encoding_conversion_buf(
      conversion.proc, conversion.from, conversion.to,
      reinterpret_cast<unsigned char *>(const_cast<char *>(character)), length,
      converted, sizeof(converted), true /* noError */);
  return done == length;
}

void append_escaped(StringInfo out, int encoding, const char *character,
                    int length) {
  if (encoding == PG_UTF8) {
    pg_wchar code =
        utf8_to_unicode(reinterpret_cast<const unsigned char *>(character));
    appendStringInfo(out, code <= 0xFFFF ? "\\u%04X" : "\\U%08X",
                     (unsigned)code);
    return;
  }
  for (int i = 0; i < length; i++)
    appendStringInfo(out, "\\x%02X", (unsigned char)character[i]);
}

} // namespace

char *key_for_message(const text *key) {
  const char *data = VARDATA_ANY(key);
  int size = VARSIZE_ANY_EXHDR(key);
  Conversion conversion{GetDatabaseEncoding(), pg_get_client_encoding(),
                        InvalidOid};
  // No conversion happens on the way to the client.
  if (conversion.from == conversion.to || conversion.from == PG_SQL_ASCII ||
      conversion.to == PG_SQL_ASCII)
    return pnstrdup(data, size);
  conversion.proc = FindDefaultConversionProc(conversion.from, conversion.to);

  StringInfoData out;
  initStringInfo(&out);
  for (int at = 0; at < size;) {
    const char *character = data + at;
    int length = Min(pg_encoding_mblen(conversion.from, character), size - at);
    if (!IS_HIGHBIT_SET(*character) || converts(conversion, character, length))
      appendBinaryStringInfo(&out, character, length);
    else
      append_escaped(&out, conversion.from, character, length);
    at += length;
  }
  return out.data;
}

// Called before ereport(): it may look up the catalog.
const char *key_text(const storage::KeyRef &key) {
  return key_for_message(key.key);
}

} // namespace idempotency::protocol
