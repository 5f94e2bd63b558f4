#include "idempotency/storage/key_store.hpp"

#include "idempotency/storage/keys.hpp"
#include "idempotency/storage/tenant_keys.hpp"

extern "C" {
#include "access/htup_details.h"
#include "catalog/namespace.h"
#include "catalog/pg_type.h"
#include "executor/spi.h"
#include "utils/builtins.h"
#include "utils/lsyscache.h"
#include "utils/syscache.h"
}

namespace idempotency::storage {

KeyStore key_store_for(const KeyRef &key) {
  if (key.has_tenant)
    return KeyStore(KeyTableKind::tenant, tenant_keys::table_for(key));
  return KeyStore(KeyTableKind::local, key_table());
}

KeyStore store_of_kind(KeyTableKind kind) {
  return KeyStore(kind, KeyTable{InvalidOid, InvalidOid, InvalidOid});
}

Oid KeyStore::relation() const {
  return kind_ == KeyTableKind::local ? schema::relation("keys")
                                      : tenant_keys::relation();
}

role_keys::Roles KeyStore::roles_with_keys(Oid relid,
                                           AttrNumber scope_column) const {
  return kind_ == KeyTableKind::local
             ? role_keys::in_keys(relid, scope_column)
             : tenant_keys::roles_with_keys(relid, scope_column);
}

uint64 KeyStore::delete_keys_of(Oid relid, AttrNumber scope_column,
                                Oid role) const {
  return kind_ == KeyTableKind::local
             ? role_keys::delete_in_keys(relid, scope_column, role)
             : tenant_keys::delete_keys_of(relid, scope_column, role);
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
}

void check_key_row_kept(TriggeredRow result, const char *table,
                        const char *fixed_columns, const text *key) {
  if (result == TriggeredRow::kept)
    return;
  // Expiry's messages name no key: it is gone, and the log is no place for it.
  bool tombstone = VARSIZE_ANY_EXHDR(key) == 0;
  const char *of_key =
      tombstone ? "the tombstone of an expired idempotency key"
                : psprintf("idempotency key \"%s\"", text_to_cstring(key));
  if (result == TriggeredRow::skipped)
    ereport(
        ERROR,
        (errcode(ERRCODE_TRIGGERED_ACTION_EXCEPTION),
         errmsg("a BEFORE INSERT trigger on %s skipped %s%s", table,
                tombstone ? "" : "the row of ", of_key),
         errdetail(tombstone ? "Without its tombstone, a late retry of the key "
                               "would run its request again; expiry keeps the "
                               "expired row instead."
                             : "Without its row, a retry of the key would run "
                               "its request again.")));
  ereport(
      ERROR,
      (errcode(ERRCODE_TRIGGERED_ACTION_EXCEPTION),
       errmsg("a BEFORE INSERT trigger on %s changed the %s of %s", table,
              fixed_columns, of_key),
       errdetail(tombstone ? "The tombstone must stay under the key that ran."
                           : "The row must stay under the key that was "
                             "claimed.")));
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

// SPI_fnumber skips dropped columns; a system column's number is negative.
Form_pg_attribute find_column(TupleDesc desc, const char *name) {
  int attnum = SPI_fnumber(desc, name);
  return attnum > 0 ? TupleDescAttr(desc, attnum - 1) : nullptr;
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
