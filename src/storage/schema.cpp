#include "idempotency/storage/schema.hpp"

extern "C" {
#include "catalog/namespace.h"
#include "utils/lsyscache.h"
}

namespace idempotency::storage::schema {

Oid oid(bool missing_ok) {
  return get_namespace_oid("idempotency", missing_ok);
}

Oid relation(const char *name) {
  Oid schema = oid(true);
  return OidIsValid(schema) ? get_relname_relid(name, schema) : InvalidOid;
}

} // namespace idempotency::storage::schema
