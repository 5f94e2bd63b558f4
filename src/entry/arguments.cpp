#include "idempotency/protocol/rules.hpp"

#include "idempotency/fingerprint/key_digest.hpp"
#include "idempotency/entry/arguments.hpp"

extern "C" {
#include "access/detoast.h"
#include "access/htup_details.h"
#include "mb/pg_wchar.h"
#include "miscadmin.h"
#include "utils/array.h"
#include "utils/builtins.h"
#include "utils/lsyscache.h"
}

namespace idempotency::entry {

namespace {

[[noreturn]] void refuse_empty(const char *what) {
  ereport(ERROR, (errcode(ERRCODE_INVALID_PARAMETER_VALUE),
                  errmsg("%s must not be empty", what)));
  pg_unreachable();
}

// `counted` is the length the limit counts (UTF-8); `stored` the length in
// the database encoding, named when it differs.
[[noreturn]] void refuse_too_long(const char *what, Size counted, Size stored) {
  ereport(ERROR,
          (errcode(ERRCODE_INVALID_PARAMETER_VALUE),
           errmsg("%s is %zu bytes long, the limit is %zu", what,
                  (size_t)counted, max_key_bytes),
           counted != stored
               ? errdetail("The limit counts bytes of UTF-8; in the database "
                           "encoding %s it is %zu bytes long.",
                           GetDatabaseEncodingName(), (size_t)stored)
               : 0));
  pg_unreachable();
}

} // namespace

// The limit counts the bytes of the text's UTF-8 form whatever the database
// encoding, so that a key accepted here is accepted again after a dump,
// replication or pg_upgrade moves it into a database of another encoding.
// A character takes at most pg_database_encoding_max_length() bytes here and
// at least one in UTF-8: a value longer than the limit times that is too
// long in UTF-8 too, and is refused before it is read.
text *sized_text(Datum value, bool is_null, const char *what) {
  if (is_null)
    ereport(ERROR, (errcode(ERRCODE_NULL_VALUE_NOT_ALLOWED),
                    errmsg("%s must not be null", what)));
  Size stored = toast_raw_datum_size(value) - VARHDRSZ;
  if (stored > max_key_bytes * pg_database_encoding_max_length())
    refuse_too_long(what, stored, stored);
  text *sized = DatumGetTextPP(value);
  Size counted = fingerprint::utf8_length(VARDATA_ANY(sized), stored);
  switch (check_key_size(counted)) {
  case KeyCheck::ok:
    break;
  case KeyCheck::empty:
    refuse_empty(what);
  case KeyCheck::too_long:
    refuse_too_long(what, counted, stored);
  }
  return sized;
}

text *sized_text_argument(FunctionCallInfo fcinfo, int argno,
                          const char *what) {
  return sized_text(PG_GETARG_DATUM(argno), PG_ARGISNULL(argno), what);
}

namespace {

// A key that passed sized_text, with the digest its table holds.
storage::KeyRef key_with_digest(text *key, bytea *(*digest_of)(const text *)) {
  storage::KeyRef ref{};
  ref.scope = GetUserId();
  ref.key = key;
  ref.digest = digest_of(key);
  ref.tenant_type = InvalidOid;
  return ref;
}

// The key argument `argno`, checked as sized_text checks it, with the
// digest its table holds.
storage::KeyRef key_argument(FunctionCallInfo fcinfo, int argno,
                             bytea *(*digest_of)(const text *)) {
  return key_with_digest(sized_text_argument(fcinfo, argno, "idempotency key"),
                         digest_of);
}

} // namespace

storage::KeyRef role_key(Datum value, bool is_null) {
  return key_with_digest(sized_text(value, is_null, "idempotency key"),
                         fingerprint::digest_of_key);
}

storage::KeyRef request_key(FunctionCallInfo fcinfo, Keying keying) {
  if (keying == Keying::by_role)
    return key_argument(fcinfo, key_argno(keying), fingerprint::digest_of_key);
  if (PG_ARGISNULL(0))
    ereport(ERROR, (errcode(ERRCODE_NULL_VALUE_NOT_ALLOWED),
                    errmsg("tenant must not be null")));
  Oid tenant_type = get_fn_expr_argtype(fcinfo->flinfo, 0);
  if (!OidIsValid(tenant_type) || tenant_type == UNKNOWNOID)
    ereport(ERROR,
            (errcode(ERRCODE_DATATYPE_MISMATCH), errmsg("tenant has no type"),
             errhint("Cast the tenant to the type of the distribution "
                     "column, e.g. 42::bigint.")));
  storage::KeyRef key = key_argument(fcinfo, key_argno(keying),
                                     fingerprint::tenant_digest_of_key);
  key.has_tenant = true;
  key.tenant_type = tenant_type;
  key.tenant = PG_GETARG_DATUM(0);
  return key;
}
namespace {

void add_arg(FnArgs &args, Oid type, Datum value, bool is_null) {
  // An untyped literal arrives as a C string of type unknown; bind it as text.
  if (type == UNKNOWNOID) {
    type = TEXTOID;
    if (!is_null)
      value = CStringGetTextDatum(DatumGetCString(value));
  }
  args.types[args.count] = type;
  args.values[args.count] = value;
  args.nulls[args.count] = is_null;
  args.count++;
}

void allocate(FnArgs &args, int capacity) {
  args.count = 0;
  args.types = static_cast<Oid *>(palloc(sizeof(Oid) * Max(capacity, 1)));
  args.values = static_cast<Datum *>(palloc(sizeof(Datum) * Max(capacity, 1)));
  args.nulls = static_cast<bool *>(palloc(sizeof(bool) * Max(capacity, 1)));
}

FnArgs collect_variadic_array(FunctionCallInfo fcinfo, int position) {
  FnArgs args;
  if (PG_ARGISNULL(position)) {
    allocate(args, 0);
    return args;
  }
  ArrayType *array = PG_GETARG_ARRAYTYPE_P(position);
  Oid element_type = ARR_ELEMTYPE(array);
  int16 typlen;
  bool typbyval;
  char typalign;
  get_typlenbyvalalign(element_type, &typlen, &typbyval, &typalign);
  Datum *values;
  bool *nulls;
  int count;
  deconstruct_array(array, element_type, typlen, typbyval, typalign, &values,
                    &nulls, &count);
  allocate(args, count);
  for (int i = 0; i < count; i++)
    add_arg(args, element_type, values[i], nulls[i]);
  return args;
}

} // namespace

FnArgs fn_arguments(FunctionCallInfo fcinfo, int first) {
  if (PG_NARGS() > first && get_fn_expr_variadic(fcinfo->flinfo))
    return collect_variadic_array(fcinfo, first);
  FnArgs args;
  allocate(args, PG_NARGS() - first);
  for (int i = first; i < PG_NARGS(); i++)
    add_arg(args, get_fn_expr_argtype(fcinfo->flinfo, i), PG_GETARG_DATUM(i),
            PG_ARGISNULL(i));
  return args;
}

} // namespace idempotency::entry
