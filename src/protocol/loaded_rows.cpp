#include "idempotency/fingerprint/fingerprint.hpp"

#include "idempotency/fingerprint/key_digest.hpp"
#include "idempotency/protocol/loaded_rows.hpp"
#include "idempotency/storage/keys.hpp"
#include "idempotency/storage/role_marks.hpp"

extern "C" {
#include "access/detoast.h"
#include "executor/spi.h"
}

namespace idempotency::protocol {

namespace {

// Whether the row has a column of this name, and it is not NULL.
bool column_is_set(TupleDesc desc, HeapTuple row, const char *name) {
  int column = SPI_fnumber(desc, name);
  bool isnull = true;
  if (column > 0)
    (void)heap_getattr(row, column, desc, &isnull);
  return !isnull;
}

} // namespace

Datum keys_loaded_body(FunctionCallInfo fcinfo) {
  if (!CALLED_AS_TRIGGER(fcinfo))
    ereport(ERROR, (errcode(ERRCODE_E_R_I_E_TRIGGER_PROTOCOL_VIOLATED),
                    errmsg("idempotency.keys_loaded() must be called as a "
                           "trigger")));
  auto *trigger = reinterpret_cast<TriggerData *>(fcinfo->context);
  if (!TRIGGER_FIRED_BEFORE(trigger->tg_event) ||
      !TRIGGER_FIRED_FOR_ROW(trigger->tg_event) ||
      !TRIGGER_FIRED_BY_INSERT(trigger->tg_event))
    ereport(ERROR,
            (errcode(ERRCODE_E_R_I_E_TRIGGER_PROTOCOL_VIOLATED),
             errmsg("idempotency.keys_loaded() must fire BEFORE INSERT FOR "
                    "EACH ROW")));
  HeapTuple row = trigger->tg_trigtuple;
  // The extension's own rows are whole already.
  if (storage::is_own_insert(trigger->tg_relation, row))
    return PointerGetDatum(row);
  TupleDesc desc = RelationGetDescr(trigger->tg_relation);
  int key_column = SPI_fnumber(desc, "key");
  int digest_column = SPI_fnumber(desc, "key_digest");
  int hash_column = SPI_fnumber(desc, "request_hash");
  if (key_column <= 0 || digest_column <= 0 || hash_column <= 0)
    return PointerGetDatum(row); // not the table this trigger is for

  // NULLs are refused by NOT NULL after this trigger.
  bool key_isnull, hash_isnull;
  Datum key = heap_getattr(row, key_column, desc, &key_isnull);
  Datum hash = heap_getattr(row, hash_column, desc, &hash_isnull);
  // Dumps before 0.4 hold request_hash as text, and before 0.3 a status.
  if ((!hash_isnull && toast_raw_datum_size(hash) - VARHDRSZ !=
                           fingerprint::fingerprint_size) ||
      column_is_set(desc, row, "status"))
    ereport(ERROR,
            (errcode(ERRCODE_FEATURE_NOT_SUPPORTED),
             errmsg("row of idempotency.keys from a version before 0.4 "
                    "cannot be loaded"),
             errdetail("Its request_hash is not a fingerprint of %d bytes, "
                       "or it has a status.",
                       (int)fingerprint::fingerprint_size),
             errhint("Restore the dump into a database with version 0.7 of "
                     "the extension, then dump that database again.")));
  // A loaded key's role gets its mark, as when the role stores a key.
  int scope_column = SPI_fnumber(desc, "scope");
  bool scope_isnull = true;
  Datum scope = (Datum)0;
  if (scope_column > 0)
    scope = heap_getattr(row, scope_column, desc, &scope_isnull);
  if (!scope_isnull)
    storage::role_marks::ensure(trigger->tg_relation, scope_column,
                                DatumGetObjectId(scope));
  // A tombstone (expired_at set) has no key text: its digest stays as dumped.
  if (key_isnull || column_is_set(desc, row, "expired_at"))
    return PointerGetDatum(row);
  Datum digest =
      PointerGetDatum(fingerprint::digest_of_key(DatumGetTextPP(key)));
  bool digest_isnull = false;
  return PointerGetDatum(heap_modify_tuple_by_cols(row, desc, 1, &digest_column,
                                                   &digest, &digest_isnull));
}

} // namespace idempotency::protocol
