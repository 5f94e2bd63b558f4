#include "idempotency/fingerprint/fingerprint.hpp"

#include "idempotency/fingerprint/key_digest.hpp"
#include "idempotency/protocol/loaded_rows.hpp"
#include "idempotency/storage/role_marks.hpp"

extern "C" {
#include "executor/spi.h"
}

namespace idempotency::protocol {

namespace {

TriggerData *row_trigger_data(FunctionCallInfo fcinfo) {
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
  return trigger;
}

// The new row's values, changed column by column.
struct Changes {
  static constexpr int max_changes = 3;
  int count;
  int columns[max_changes];
  Datum values[max_changes];
  bool nulls[max_changes];

  void add(int column, Datum value, bool isnull) {
    columns[count] = column;
    values[count] = value;
    nulls[count] = isnull;
    count++;
  }
};

// A request_hash stored before 0.4, read from its text: the fingerprint
// the update to 0.4 made of it.
bytea *fingerprint_of_text_hash(const bytea *text_hash) {
  fingerprint::Fingerprint bytes;
  fingerprint::legacy_fingerprint(VARDATA_ANY(text_hash),
                                  VARSIZE_ANY_EXHDR(text_hash), bytes);
  bytea *result =
      static_cast<bytea *>(palloc(VARHDRSZ + fingerprint::fingerprint_size));
  SET_VARSIZE(result, VARHDRSZ + fingerprint::fingerprint_size);
  memcpy(VARDATA(result), bytes, fingerprint::fingerprint_size);
  return result;
}

// A loaded key's role gets its mark, as when the role stores a key: the
// keys of a restored dump hold their roles from the start.
void mark_role_of(Relation keys, HeapTuple row) {
  TupleDesc desc = RelationGetDescr(keys);
  int scope_column = SPI_fnumber(desc, "scope");
  if (scope_column <= 0)
    return;
  bool isnull;
  Datum scope = heap_getattr(row, scope_column, desc, &isnull);
  if (!isnull)
    storage::role_marks::ensure(keys, scope_column, DatumGetObjectId(scope));
}

} // namespace

namespace {

Datum fix_loaded_row(FunctionCallInfo fcinfo, bool ordered) {
  TriggerData *trigger = row_trigger_data(fcinfo);
  HeapTuple row = trigger->tg_trigtuple;
  TupleDesc desc = RelationGetDescr(trigger->tg_relation);
  int key_column = SPI_fnumber(desc, "key");
  int digest_column = SPI_fnumber(desc, "key_digest");
  int hash_column = SPI_fnumber(desc, "request_hash");
  int status_column = SPI_fnumber(desc, "status");
  if (key_column <= 0 || digest_column <= 0 || hash_column <= 0)
    return PointerGetDatum(row); // not the table this trigger is for
  mark_role_of(trigger->tg_relation, row);

  Changes changes{};
  bool key_isnull, digest_isnull, hash_isnull;
  Datum key = heap_getattr(row, key_column, desc, &key_isnull);
  (void)heap_getattr(row, digest_column, desc, &digest_isnull);
  Datum hash = heap_getattr(row, hash_column, desc, &hash_isnull);
  // A NULL key is refused by NOT NULL after this trigger.
  if (!key_isnull)
    changes.add(digest_column,
                PointerGetDatum(
                    ordered ? fingerprint::digest_of_key(DatumGetTextPP(key))
                            : fingerprint::unordered_digest_of_key(
                                  DatumGetTextPP(key))),
                false);
  if (digest_isnull && !hash_isnull)
    changes.add(
        hash_column,
        PointerGetDatum(fingerprint_of_text_hash(DatumGetByteaPP(hash))),
        false);
  if (status_column > 0)
    changes.add(status_column, (Datum)0, true);
  if (changes.count == 0)
    return PointerGetDatum(row);
  return PointerGetDatum(
      heap_modify_tuple_by_cols(row, desc, changes.count, changes.columns,
                                changes.values, changes.nulls));
}

} // namespace

Datum keys_loaded_body(FunctionCallInfo fcinfo) {
  return fix_loaded_row(fcinfo, true);
}

Datum unordered_keys_loaded_body(FunctionCallInfo fcinfo) {
  return fix_loaded_row(fcinfo, false);
}

} // namespace idempotency::protocol
