#include "fingerprint/fingerprint.hpp"

#include "fingerprint/request_hash.hpp"

namespace idempotency::fingerprint {

namespace {

struct EncodedValue {
  const char *data;
  std::size_t size;
};

Oid binary_send_function(Oid type) {
  HeapTuple tuple = SearchSysCache1(TYPEOID, ObjectIdGetDatum(type));
  if (!HeapTupleIsValid(tuple))
    elog(ERROR, "cache lookup failed for type %u", type);
  Oid send = reinterpret_cast<Form_pg_type>(GETSTRUCT(tuple))->typsend;
  ReleaseSysCache(tuple);
  return send;
}

EncodedValue encode_value(Oid type, Datum value) {
  Oid send = binary_send_function(type);
  if (OidIsValid(send)) {
    bytea *bytes = OidSendFunctionCall(send, value);
    return {VARDATA_ANY(bytes), VARSIZE_ANY_EXHDR(bytes)};
  }
  Oid output;
  bool is_varlena;
  getTypeOutputInfo(type, &output, &is_varlena);
  char *text_form = OidOutputFunctionCall(output, value);
  return {text_form, strlen(text_form)};
}

void hash_request(text *fn, const protocol::FnArgs &args,
                  char (&hex)[hex_size]) {
  RequestFingerprint fingerprint(VARDATA_ANY(fn), VARSIZE_ANY_EXHDR(fn));
  for (int i = 0; i < args.count; i++) {
    const char *type_name = format_type_be_qualified(args.types[i]);
    if (args.nulls[i]) {
      fingerprint.add_null_argument(type_name, strlen(type_name));
      continue;
    }
    EncodedValue encoded = encode_value(args.types[i], args.values[i]);
    fingerprint.add_argument(type_name, strlen(type_name), encoded.data,
                             encoded.size);
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

text *compute_request_hash(text *fn, const protocol::FnArgs &args) {
  char hex[hex_size];
  in_database_encoding([&] { hash_request(fn, args, hex); });
  return cstring_to_text(hex);
}

} // namespace idempotency::fingerprint
