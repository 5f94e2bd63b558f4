#include "idempotency/storage/table_owner.hpp"

extern "C" {
#include "access/htup_details.h"
#include "catalog/pg_class.h"
#include "executor/spi.h"
#include "miscadmin.h"
#include "utils/syscache.h"
}

namespace idempotency::storage::table_owner {

Oid of(Oid relid) {
  HeapTuple tuple = SearchSysCache1(RELOID, ObjectIdGetDatum(relid));
  if (!HeapTupleIsValid(tuple))
    elog(ERROR, "cache lookup failed for relation %u", relid);
  Oid owner = reinterpret_cast<Form_pg_class>(GETSTRUCT(tuple))->relowner;
  ReleaseSysCache(tuple);
  return owner;
}

Saved become(Oid owner) {
  Saved saved;
  GetUserIdAndSecContext(&saved.user, &saved.context);
  SetUserIdAndSecContext(owner, saved.context | SECURITY_LOCAL_USERID_CHANGE);
  return saved;
}

void restore(const Saved &saved) {
  SetUserIdAndSecContext(saved.user, saved.context);
}

Saved begin_spi(Oid owner) {
  Saved saved = become(owner);
  if (SPI_connect() != SPI_OK_CONNECT)
    elog(ERROR, "SPI_connect failed");
  return saved;
}

void finish_spi(const Saved &saved) {
  SPI_finish();
  restore(saved);
}

} // namespace idempotency::storage::table_owner
