#include "idempotency/protocol/rules.hpp"

#include "idempotency/fingerprint/key_digest.hpp"
#include "idempotency/entry/key_arguments.hpp"

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
  return storage::KeyRef{GetUserId(),
                         key,
                         fingerprint::digest_of_key(key),
                         fingerprint::legacy_digest_of_key(key),
                         false,
                         InvalidOid,
                         0};
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
  key.has_tenant = true;
  key.tenant_type = tenant_type;
  key.tenant = PG_GETARG_DATUM(0);
  return key;
}
} // namespace idempotency::entry
