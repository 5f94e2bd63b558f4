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
                 const FnArgs &args, char (&hex)[hex_size]) {
  for (int i = 0; i < args.count; i++) {
    if (args.nulls[i]) {
      fingerprint.add_null();
      continue;
    }
    EncodedValue encoded = encode(encoders[i], args.values[i]);
    fingerprint.add_value(encoded.data, encoded.size);
  }
  fingerprint.finish_hex(hex);
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

text *request_hash(const RequestFingerprint &prefix,
                   const ValueEncoder *encoders, const FnArgs &args) {
  char hex[hex_size];
  in_database_encoding([&] { hash_values(prefix, encoders, args, hex); });
  return cstring_to_text(hex);
}

} // namespace idempotency::fingerprint
