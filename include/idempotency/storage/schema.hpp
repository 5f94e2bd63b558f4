// The extension's schema, idempotency, and the relations in it, found by
// name: the extension is not relocatable, so every object it made is there.
// Each lookup is PostgreSQL's syscache one (cheap); a schema renamed or
// dropped is seen at once.
#pragma once

#include "idempotency/pg.hpp"

namespace idempotency::storage::schema {

// The schema's OID; InvalidOid when it does not exist and `missing_ok`,
// else 3F000.
Oid oid(bool missing_ok);

// The relation `name` of the schema; InvalidOid when it or the schema does
// not exist.
Oid relation(const char *name);

} // namespace idempotency::storage::schema
