#include "idempotency/storage/derived_key_secret.hpp"

#include "idempotency/compat.hpp"
#include "idempotency/storage/schema.hpp"

extern "C" {
#include "access/table.h"
#include "access/tableam.h"
#include "catalog/pg_type.h"
#include "executor/tuptable.h"
#include "utils/rel.h"
#include "utils/snapmgr.h"
}

namespace idempotency::storage {

namespace {

constexpr const char *secret_table = "derived_key_secret";

const char *const make_a_secret_hint =
    "A superuser can make one: INSERT INTO idempotency.derived_key_secret "
    "SELECT pg_catalog.sha256(pg_catalog.uuid_send(pg_catalog.gen_random_"
    "uuid()) || pg_catalog.uuid_send(pg_catalog.gen_random_uuid()) || "
    "pg_catalog.uuid_send(pg_catalog.gen_random_uuid())). It changes every "
    "derived key: restore the old secret instead if it can be found.";

[[noreturn]] void no_secret(const char *detail) {
  ereport(ERROR, (errcode(ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE),
                  errmsg("this database has no derived-key secret"),
                  errdetail("%s", detail), errhint("%s", make_a_secret_hint)));
  pg_unreachable();
}

// The column "secret", found by name like every column the library reads.
AttrNumber secret_column(Relation rel) {
  TupleDesc desc = RelationGetDescr(rel);
  for (int i = 0; i < desc->natts; i++) {
    Form_pg_attribute attribute = TupleDescAttr(desc, i);
    if (!attribute->attisdropped &&
        strcmp(NameStr(attribute->attname), "secret") == 0 &&
        attribute->atttypid == BYTEAOID)
      return attribute->attnum;
  }
  no_secret("Table idempotency.derived_key_secret has no column secret of "
            "type bytea.");
}

} // namespace

DerivedKeySecret read_derived_key_secret() {
  Oid relid = schema::relation(secret_table);
  if (!OidIsValid(relid))
    no_secret("Table idempotency.derived_key_secret does not exist.");
  Relation rel = table_open(relid, AccessShareLock);
  AttrNumber column = secret_column(rel);
  // The statement's snapshot (a STABLE function's), so that a rotation
  // committed meanwhile is seen from the next statement on.
  Snapshot snapshot =
      ActiveSnapshotSet() ? GetActiveSnapshot() : GetTransactionSnapshot();
  // Through the table access method's slots: the table is heap unless a
  // default_table_access_method said otherwise at install.
  TupleTableSlot *slot = table_slot_create(rel, nullptr);
  TableScanDesc scan =
      compat::table_beginscan(rel, snapshot, 0, nullptr, compat::SO_NONE);
  DerivedKeySecret secret{};
  int rows = 0;
  bool size_ok = false;
  while (table_scan_getnextslot(scan, ForwardScanDirection, slot)) {
    rows++;
    bool is_null;
    Datum value = slot_getattr(slot, column, &is_null);
    size_ok = false;
    if (is_null)
      continue;
    bytea *bytes = DatumGetByteaPP(value);
    if (VARSIZE_ANY_EXHDR(bytes) == derived_key_secret_bytes) {
      memcpy(secret.bytes, VARDATA_ANY(bytes), derived_key_secret_bytes);
      size_ok = true;
    }
    if (reinterpret_cast<Pointer>(bytes) != DatumGetPointer(value)) {
      explicit_bzero(VARDATA_ANY(bytes), VARSIZE_ANY_EXHDR(bytes));
      pfree(bytes);
    }
  }
  table_endscan(scan);
  ExecDropSingleTupleTableSlot(slot);
  table_close(rel, AccessShareLock);
  if (rows == 0)
    no_secret("Table idempotency.derived_key_secret holds no row.");
  if (rows > 1) {
    explicit_bzero(secret.bytes, sizeof secret.bytes);
    no_secret("Table idempotency.derived_key_secret holds more than one row.");
  }
  if (!size_ok)
    no_secret("The secret in idempotency.derived_key_secret is not 32 bytes "
              "long.");
  return secret;
}

} // namespace idempotency::storage
