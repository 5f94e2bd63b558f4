#include "idempotency/fingerprint/request_hash.hpp"

#include "idempotency/fingerprint/key_digest.hpp"

extern "C" {
#include "access/htup_details.h"
#include "catalog/pg_type.h"
#include "mb/pg_wchar.h"
#include "utils/builtins.h"
#include "utils/lsyscache.h"
#include "utils/syscache.h"
}

namespace idempotency::fingerprint {

namespace {

// A UTF8 or SQL_ASCII database, whose text is its own UTF-8 form.
bool database_text_is_utf8() {
  int encoding = GetDatabaseEncoding();
  return encoding == PG_UTF8 || encoding == PG_SQL_ASCII;
}

struct Bytes {
  const char *data;
  std::size_t size;
};
static_assert(std::is_trivially_destructible_v<Bytes>);

Bytes utf8_form(const char *data, std::size_t size) {
  if (database_text_is_utf8())
    return {data, size};
  char *converted = pg_server_to_any(data, (int)size, PG_UTF8);
  return {converted, converted == data ? size : strlen(converted)};
}

// Send functions of text-like types convert to the client encoding: UTF8
// while hashing, whatever client_encoding a retry arrives with.
template <typename Body> void with_utf8_client_encoding(Body body) {
  int client_encoding = pg_get_client_encoding();
  if (client_encoding == PG_UTF8 ||
      (database_text_is_utf8() && client_encoding == GetDatabaseEncoding())) {
    body();
    return;
  }
  if (PrepareClientEncoding(PG_UTF8) < 0 || SetClientEncoding(PG_UTF8) < 0)
    elog(ERROR, "cannot convert the database encoding to %s",
         pg_encoding_to_char(PG_UTF8));
  PG_TRY();
  { body(); }
  PG_FINALLY();
  { SetClientEncoding(client_encoding); }
  PG_END_TRY();
}

RequestFingerprint framing(text *fn) {
  if (fn == nullptr)
    return RequestFingerprint::for_claim();
  Bytes sql = utf8_form(VARDATA_ANY(fn), VARSIZE_ANY_EXHDR(fn));
  return RequestFingerprint(sql.data, sql.size);
}

} // namespace

ValueEncoder encoder_for(Oid type) {
  HeapTuple tuple = SearchSysCache1(TYPEOID, ObjectIdGetDatum(type));
  if (!HeapTupleIsValid(tuple))
    elog(ERROR, "cache lookup failed for type %u", type);
  Oid send = reinterpret_cast<Form_pg_type>(GETSTRUCT(tuple))->typsend;
  ReleaseSysCache(tuple);
  if (OidIsValid(send))
    return {send, true};
  Oid output;
  bool is_varlena;
  getTypeOutputInfo(type, &output, &is_varlena);
  return {output, false};
}

RequestFingerprint prefix_for(text *fn, int nargs, const Oid *types) {
  RequestFingerprint prefix = framing(fn);
  for (int i = 0; i < nargs; i++) {
    const char *type_name = format_type_be_qualified(types[i]);
    Bytes name = utf8_form(type_name, strlen(type_name));
    prefix.add_type(name.data, name.size);
  }
  return prefix;
}

bytea *request_hash(const RequestFingerprint &prefix,
                    const ValueEncoder *encoders, const FnArgs &args) {
  RequestFingerprint fingerprint = prefix;
  Fingerprint digest;
  with_utf8_client_encoding([&] {
    for (int i = 0; i < args.count; i++) {
      Oid function = encoders[i].function;
      if (args.nulls[i]) {
        fingerprint.add_null();
      } else if (encoders[i].binary) {
        bytea *bytes = OidSendFunctionCall(function, args.values[i]);
        fingerprint.add_value(VARDATA_ANY(bytes), VARSIZE_ANY_EXHDR(bytes));
      } else {
        char *text_form = OidOutputFunctionCall(function, args.values[i]);
        fingerprint.add_value(text_form, strlen(text_form));
      }
    }
    fingerprint.finish(digest);
  });
  return as_bytea(digest, fingerprint_size);
}

bytea *client_fingerprint(text *fn, text *client_hash) {
  RequestFingerprint framed = framing(fn);
  if (client_hash == nullptr) {
    framed.add_null();
  } else {
    Bytes hash =
        utf8_form(VARDATA_ANY(client_hash), VARSIZE_ANY_EXHDR(client_hash));
    framed.add_client_hash(hash.data, hash.size);
  }
  Fingerprint digest;
  framed.finish(digest);
  return as_bytea(digest, fingerprint_size);
}

} // namespace idempotency::fingerprint
