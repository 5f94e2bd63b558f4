#include "idempotency/protocol/call.hpp"
#include "idempotency/protocol/response_limit.hpp"
#include "idempotency/settings/settings.hpp"

extern "C" {
#include "access/detoast.h"
}

namespace idempotency::protocol {

// A superuser bounds what a role may keep: a response over
// idempotency.max_response_size fails the call before anything is stored.
void check_response_size(const storage::KeyRef &key, Datum response,
                         bool response_is_null) {
  if (response_is_null)
    return;
  Size bytes = toast_raw_datum_size(response);
  if (bytes <= settings::max_response_bytes())
    return;
  const char *shown = key_text(key);
  ereport(ERROR,
          (errcode(ERRCODE_PROGRAM_LIMIT_EXCEEDED),
           errmsg("response of idempotency key \"%s\" is %zu bytes, over "
                  "idempotency.max_response_size (%zu bytes)",
                  shown, (size_t)bytes, (size_t)settings::max_response_bytes()),
           errhint("Store a smaller response, or ask a superuser to raise "
                   "idempotency.max_response_size.")));
}

} // namespace idempotency::protocol
