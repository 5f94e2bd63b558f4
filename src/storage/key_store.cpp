#include "idempotency/storage/key_store.hpp"

#include "idempotency/storage/keys.hpp"
#include "idempotency/storage/tenant_keys.hpp"

extern "C" {
#include "access/htup_details.h"
#include "catalog/namespace.h"
#include "catalog/pg_type.h"
#include "utils/builtins.h"
#include "utils/lsyscache.h"
#include "utils/syscache.h"
}

namespace idempotency::storage {

KeyStore key_store_for(const KeyRef &key) {
  if (key.has_tenant)
    return KeyStore(tenant_keys::backend, tenant_keys::table_for(key));
  return KeyStore(local_keys, key_table());
}

const KeyBackend &key_backend(int index) {
  Assert(index >= 0 && index < key_backend_count);
  if (index == 0)
    return local_keys;
  return tenant_keys::backend;
}

KeyStore expiry_store(int index) {
  return KeyStore(key_backend(index),
                  KeyTable{InvalidOid, InvalidOid, InvalidOid});
}

// Practically never by chance, but a row whose key text was changed by hand
// lands here too. Answering for the other key would hand out its response.
void report_shared_digest() {
  ereport(ERROR,
          (errcode(ERRCODE_UNIQUE_VIOLATION),
           errmsg("idempotency key shares its digest with another stored key "
                  "of this role"),
           errdetail("idempotency.keys holds a row under the same scope and "
                     "key_digest whose key is different."),
           errhint("Use another idempotency key. A row whose key was changed "
                   "by hand needs key_digest = idempotency.key_digest(key).")));
  pg_unreachable();
}

void check_key_row_kept(TriggeredRow result, const char *table,
                        const char *fixed_columns, const text *key) {
  if (result == TriggeredRow::kept)
    return;
  // Expiry's messages name no key: the text is gone, and the log is no
  // place for it.
  if (VARSIZE_ANY_EXHDR(key) == 0 && result == TriggeredRow::skipped)
    ereport(ERROR,
            (errcode(ERRCODE_TRIGGERED_ACTION_EXCEPTION),
             errmsg("a BEFORE INSERT trigger on %s skipped the tombstone of "
                    "an expired idempotency key",
                    table),
             errdetail("Without its tombstone, a late retry of the key would "
                       "run its request again; expiry keeps the expired "
                       "row instead.")));
  if (VARSIZE_ANY_EXHDR(key) == 0)
    ereport(ERROR,
            (errcode(ERRCODE_TRIGGERED_ACTION_EXCEPTION),
             errmsg("a BEFORE INSERT trigger on %s changed the %s of the "
                    "tombstone of an expired idempotency key",
                    table, fixed_columns),
             errdetail("The tombstone must stay under the key that ran.")));
  if (result == TriggeredRow::skipped)
    ereport(ERROR,
            (errcode(ERRCODE_TRIGGERED_ACTION_EXCEPTION),
             errmsg("a BEFORE INSERT trigger on %s skipped the row of "
                    "idempotency key \"%s\"",
                    table, text_to_cstring(key)),
             errdetail("Without its row, a retry of the key would run its "
                       "request again.")));
  ereport(ERROR,
          (errcode(ERRCODE_TRIGGERED_ACTION_EXCEPTION),
           errmsg("a BEFORE INSERT trigger on %s changed the %s of "
                  "idempotency key \"%s\"",
                  table, fixed_columns, text_to_cstring(key)),
           errdetail("The row must stay under the key that was claimed.")));
}

namespace schema {

Oid oid(bool missing_ok) {
  return get_namespace_oid("idempotency", missing_ok);
}

Oid relation(const char *name) {
  Oid schema = oid(true);
  return OidIsValid(schema) ? get_relname_relid(name, schema) : InvalidOid;
}

} // namespace schema

Form_pg_attribute find_column(TupleDesc desc, const char *name) {
  for (int i = 0; i < desc->natts; i++) {
    Form_pg_attribute attribute = TupleDescAttr(desc, i);
    if (!attribute->attisdropped &&
        strcmp(NameStr(attribute->attname), name) == 0)
      return attribute;
  }
  return nullptr;
}

bool fits_scope(Oid type) {
  if (getBaseType(type) == REGROLEOID)
    return true;
  HeapTuple tuple = SearchSysCache1(TYPEOID, ObjectIdGetDatum(type));
  if (!HeapTupleIsValid(tuple))
    return false;
  Form_pg_type form = reinterpret_cast<Form_pg_type>(GETSTRUCT(tuple));
  bool fits = form->typlen == 4 && form->typbyval &&
              form->typnamespace == schema::oid(true);
  ReleaseSysCache(tuple);
  return fits;
}

} // namespace idempotency::storage
