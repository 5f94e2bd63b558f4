#include "idempotency/fingerprint/request_hash.hpp"

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

struct Bytes {
  const char *data;
  std::size_t size;
};
static_assert(std::is_trivially_destructible_v<Bytes>);

Bytes in_form(const char *data, std::size_t size, TextForm form) {
  if (form == TextForm::database || text_forms_agree())
    return {data, size};
  char *converted = pg_server_to_any(data, (int)size, PG_UTF8);
  return {converted, converted == data ? size : strlen(converted)};
}

Bytes in_form(const text *value, TextForm form) {
  return in_form(VARDATA_ANY(value), VARSIZE_ANY_EXHDR(value), form);
}

Bytes encode(const ValueEncoder &encoder, Datum value) {
  if (encoder.binary) {
    bytea *bytes = OidSendFunctionCall(encoder.function, value);
    return {VARDATA_ANY(bytes), VARSIZE_ANY_EXHDR(bytes)};
  }
  char *text_form = OidOutputFunctionCall(encoder.function, value);
  return {text_form, strlen(text_form)};
}

void hash_values(RequestFingerprint fingerprint, const ValueEncoder *encoders,
                 const FnArgs &args, Fingerprint &out) {
  for (int i = 0; i < args.count; i++) {
    if (args.nulls[i]) {
      fingerprint.add_null();
      continue;
    }
    Bytes encoded = encode(encoders[i], args.values[i]);
    fingerprint.add_value(encoded.data, encoded.size);
  }
  fingerprint.finish(out);
}

int encoding_of(TextForm form) {
  return form == TextForm::utf8 ? PG_UTF8 : GetDatabaseEncoding();
}

// Send functions of text-like types convert to the client encoding; hashing
// with the client encoding set to the form's keeps a request's fingerprint
// the same whatever client_encoding the retry arrives with.
template <typename Body> void with_client_encoding(int encoding, Body body) {
  int client_encoding = pg_get_client_encoding();
  if (client_encoding == encoding ||
      (encoding == PG_UTF8 && text_forms_agree() &&
       client_encoding == GetDatabaseEncoding())) {
    body();
    return;
  }
  if (PrepareClientEncoding(encoding) < 0 || SetClientEncoding(encoding) < 0)
    elog(ERROR, "cannot convert the database encoding to %s",
         pg_encoding_to_char(encoding));
  PG_TRY();
  { body(); }
  PG_FINALLY();
  { SetClientEncoding(client_encoding); }
  PG_END_TRY();
}

bytea *framed_client_text(RequestFingerprint framed, const text *client_hash,
                          TextForm form) {
  Bytes hash = in_form(client_hash, form);
  framed.add_client_hash(hash.data, hash.size);
  Fingerprint digest;
  framed.finish(digest);
  return as_bytea(digest);
}

RequestFingerprint framing(text *fn, TextForm form) {
  if (fn == nullptr)
    return RequestFingerprint::for_claim();
  Bytes sql = in_form(fn, form);
  return RequestFingerprint(sql.data, sql.size);
}

} // namespace

bool text_forms_agree() {
  int encoding = GetDatabaseEncoding();
  return encoding == PG_UTF8 || encoding == PG_SQL_ASCII;
}

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

RequestFingerprint prefix_for(text *fn, int nargs, const Oid *types,
                              TextForm form) {
  RequestFingerprint prefix = framing(fn, form);
  for (int i = 0; i < nargs; i++) {
    const char *type_name = format_type_be_qualified(types[i]);
    Bytes name = in_form(type_name, strlen(type_name), form);
    prefix.add_type(name.data, name.size);
  }
  return prefix;
}

bytea *request_hash(const RequestFingerprint &prefix,
                    const ValueEncoder *encoders, const FnArgs &args,
                    TextForm form) {
  Fingerprint digest;
  with_client_encoding(encoding_of(form),
                       [&] { hash_values(prefix, encoders, args, digest); });
  return as_bytea(digest);
}

bytea *as_bytea(const Fingerprint &fingerprint) {
  bytea *value = static_cast<bytea *>(palloc(VARHDRSZ + fingerprint_size));
  SET_VARSIZE(value, VARHDRSZ + fingerprint_size);
  memcpy(VARDATA(value), fingerprint, fingerprint_size);
  return value;
}

ClientFingerprints client_fingerprints(text *fn, text *client_hash) {
  ClientFingerprints fingerprints{
      framed_client_text(framing(fn, TextForm::utf8), client_hash,
                         TextForm::utf8),
      nullptr};
  if (!text_forms_agree())
    fingerprints.earlier = framed_client_text(framing(fn, TextForm::database),
                                              client_hash, TextForm::database);
  return fingerprints;
}

bytea *legacy_client_fingerprint(const text *client_hash) {
  Fingerprint digest;
  legacy_fingerprint(VARDATA_ANY(client_hash), VARSIZE_ANY_EXHDR(client_hash),
                     digest);
  return as_bytea(digest);
}

} // namespace idempotency::fingerprint
