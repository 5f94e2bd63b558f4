#include "idempotency/storage/columns.hpp"

#include "idempotency/storage/schema.hpp"

extern "C" {
#include "access/htup_details.h"
#include "catalog/namespace.h"
#include "catalog/pg_type.h"
#include "utils/lsyscache.h"
#include "utils/syscache.h"
}

namespace idempotency::storage {

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
