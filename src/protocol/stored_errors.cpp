#include "idempotency/settings/sqlstate_list.hpp"

#include "idempotency/protocol/stored_errors.hpp"

#include "idempotency/boundary/subtransaction.hpp"
#include "idempotency/settings/settings.hpp"

#include "idempotency/compat.hpp"

extern "C" {
#include "utils/jsonb.h"
}

namespace idempotency::protocol {

namespace {

void push_key(compat::JsonbInState *state, const char *key) {
  JsonbValue value;
  value.type = jbvString;
  value.val.string.val = const_cast<char *>(key);
  value.val.string.len = (int)strlen(key);
  compat::pushJsonbValue(state, WJB_KEY, &value);
}

// A string member, or JSON null when the error has no such field.
void push_member(compat::JsonbInState *state, const char *key,
                 const char *text) {
  push_key(state, key);
  JsonbValue value;
  if (text == nullptr) {
    value.type = jbvNull;
  } else {
    value.type = jbvString;
    value.val.string.val = const_cast<char *>(text);
    value.val.string.len = (int)strlen(text);
  }
  compat::pushJsonbValue(state, WJB_VALUE, &value);
}

Datum error_document(const ErrorData *error) {
  compat::JsonbInState state{};
  compat::pushJsonbValue(&state, WJB_BEGIN_OBJECT, nullptr);
  push_key(&state, "error");
  compat::pushJsonbValue(&state, WJB_BEGIN_OBJECT, nullptr);
  push_member(&state, "sqlstate", unpack_sql_state(error->sqlerrcode));
  push_member(&state, "message", error->message);
  push_member(&state, "detail", error->detail);
  push_member(&state, "hint", error->hint);
  compat::pushJsonbValue(&state, WJB_END_OBJECT, nullptr);
  compat::pushJsonbValue(&state, WJB_END_OBJECT, nullptr);
  return JsonbPGetDatum(JsonbValueToJsonb(state.result));
}

// A transient condition (a lock timeout, a cancel, ...) is never stored,
// even when its class is listed: a retry must run fn again.
bool error_is_stored(const ErrorData *error) {
  const char *sqlstate = unpack_sql_state(error->sqlerrcode);
  return sqlstate_listed(settings::stored_errors(), sqlstate) &&
         !sqlstate_transient(sqlstate);
}

} // namespace

Datum run_fn_storing_errors(Statement &statement, const FnArgs &args,
                            bool *is_null, bool *is_error) {
  *is_error = false;
  if (settings::stored_errors().count == 0)
    return run_fn(statement, args, is_null);

  // fn's effects live in a subtransaction that a stored error rolls back.
  Datum response = (Datum)0;
  run_in_subtransaction([&] { response = run_fn(statement, args, is_null); },
                        [&](const ErrorData *error) {
                          if (!error_is_stored(error))
                            return false;
                          response = error_document(error);
                          *is_null = false;
                          *is_error = true;
                          return true;
                        });
  return response;
}

bool is_error_document(Datum response, bool response_is_null) {
  if (response_is_null)
    return false;
  Jsonb *document = DatumGetJsonbP(response);
  if (!JB_ROOT_IS_OBJECT(document) || JB_ROOT_COUNT(document) != 1)
    return false;
  JsonbValue error;
  if (getKeyJsonValueFromContainer(&document->root, "error", 5, &error) ==
          nullptr ||
      error.type != jbvBinary || !JsonContainerIsObject(error.val.binary.data))
    return false;
  JsonbValue sqlstate;
  return getKeyJsonValueFromContainer(error.val.binary.data, "sqlstate", 8,
                                      &sqlstate) != nullptr &&
         sqlstate.type == jbvString && sqlstate.val.string.len == 5;
}

} // namespace idempotency::protocol
