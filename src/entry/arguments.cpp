#include "idempotency/protocol/rules.hpp"

#include "idempotency/fingerprint/key_digest.hpp"
#include "idempotency/entry/arguments.hpp"

extern "C" {
#include "access/detoast.h"
#include "access/htup_details.h"
#include "miscadmin.h"
#include "utils/array.h"
#include "utils/builtins.h"
#include "utils/lsyscache.h"
}

namespace idempotency::entry {

storage::KeyRef key_argument(FunctionCallInfo fcinfo, int argno) {
  if (PG_ARGISNULL(argno))
    ereport(ERROR, (errcode(ERRCODE_NULL_VALUE_NOT_ALLOWED),
                    errmsg("idempotency key must not be null")));
  Size key_bytes = toast_raw_datum_size(PG_GETARG_DATUM(argno)) - VARHDRSZ;
  switch (check_key_size(key_bytes)) {
  case KeyCheck::ok:
    break;
  case KeyCheck::empty:
    ereport(ERROR, (errcode(ERRCODE_INVALID_PARAMETER_VALUE),
                    errmsg("idempotency key must not be empty")));
  case KeyCheck::too_long:
    ereport(ERROR,
            (errcode(ERRCODE_INVALID_PARAMETER_VALUE),
             errmsg("idempotency key is %zu bytes long, the limit is %zu",
                    (size_t)key_bytes, max_key_bytes)));
  }
  text *key = PG_GETARG_TEXT_PP(argno);
  storage::KeyRef ref{};
  ref.scope = GetUserId();
  ref.key = key;
  ref.digest = fingerprint::digest_of_key(key, &ref.unordered_digest);
  ref.legacy_digest = fingerprint::legacy_digest_of_key(key);
  ref.tenant_type = InvalidOid;
  return ref;
}

storage::KeyRef request_key(FunctionCallInfo fcinfo, Keying keying) {
  if (keying == Keying::by_role)
    return key_argument(fcinfo, key_argno(keying));
  if (PG_ARGISNULL(0))
    ereport(ERROR, (errcode(ERRCODE_NULL_VALUE_NOT_ALLOWED),
                    errmsg("tenant must not be null")));
  Oid tenant_type = get_fn_expr_argtype(fcinfo->flinfo, 0);
  if (!OidIsValid(tenant_type) || tenant_type == UNKNOWNOID)
    ereport(ERROR,
            (errcode(ERRCODE_DATATYPE_MISMATCH), errmsg("tenant has no type"),
             errhint("Cast the tenant to the type of the distribution "
                     "column, e.g. 42::bigint.")));
  storage::KeyRef key = key_argument(fcinfo, key_argno(keying));
  // idempotency.tenant_keys keeps the unordered digest: its rows live in
  // Citus shards, which the update to 0.7 leaves as they are.
  if (key.unordered_digest != nullptr)
    key.digest = key.unordered_digest;
  key.unordered_digest = nullptr;
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
