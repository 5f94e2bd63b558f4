#include "fingerprint/request_hash.hpp"

namespace idempotency::fingerprint {

namespace {

struct EncodedValue {
  const char *data;
  std::size_t size;
};
static_assert(std::is_trivially_destructible_v<EncodedValue>);

EncodedValue encode(const ValueEncoder &encoder, Datum value) {
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
    EncodedValue encoded = encode(encoders[i], args.values[i]);
    fingerprint.add_value(encoded.data, encoded.size);
  }
  fingerprint.finish(out);
}

// Send functions of text-like types convert to the client encoding; hashing
// in the database encoding keeps a request's fingerprint the same whatever
// client_encoding the retry arrives with, and never fails to convert.
template <typename Body> void in_database_encoding(Body body) {
  int client_encoding = pg_get_client_encoding();
  if (client_encoding == GetDatabaseEncoding()) {
    body();
    return;
  }
  SetClientEncoding(GetDatabaseEncoding());
  PG_TRY();
  { body(); }
  PG_FINALLY();
  { SetClientEncoding(client_encoding); }
  PG_END_TRY();
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

RequestFingerprint prefix_for(text *fn, const FnArgs &args) {
  RequestFingerprint prefix(VARDATA_ANY(fn), VARSIZE_ANY_EXHDR(fn));
  for (int i = 0; i < args.count; i++) {
    const char *type_name = format_type_be_qualified(args.types[i]);
    prefix.add_type(type_name, strlen(type_name));
  }
  return prefix;
}

bytea *request_hash(const RequestFingerprint &prefix,
                    const ValueEncoder *encoders, const FnArgs &args) {
  Fingerprint digest;
  in_database_encoding([&] { hash_values(prefix, encoders, args, digest); });
  return as_bytea(digest);
}

bytea *as_bytea(const Fingerprint &fingerprint) {
  bytea *value = static_cast<bytea *>(palloc(VARHDRSZ + fingerprint_size));
  SET_VARSIZE(value, VARHDRSZ + fingerprint_size);
  memcpy(VARDATA(value), fingerprint, fingerprint_size);
  return value;
}

bytea *client_fingerprint(RequestFingerprint framed, text *client_hash) {
  framed.add_client_hash(VARDATA_ANY(client_hash),
                         VARSIZE_ANY_EXHDR(client_hash));
  Fingerprint digest;
  framed.finish(digest);
  return as_bytea(digest);
}

bytea *legacy_client_fingerprint(const text *client_hash) {
  Fingerprint digest;
  legacy_fingerprint(VARDATA_ANY(client_hash), VARSIZE_ANY_EXHDR(client_hash),
                     digest);
  return as_bytea(digest);
}

} // namespace idempotency::fingerprint
