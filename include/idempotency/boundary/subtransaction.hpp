// Catching a PostgreSQL error without ending the transaction, as a PL/pgSQL
// block with an EXCEPTION clause does.
#pragma once

#include "idempotency/pg.hpp"

extern "C" {
#include "access/xact.h"
#include "utils/resowner.h"
}

namespace idempotency {

// Runs body() in an internal subtransaction; true when it finished. After
// an error, rolled back, `handled(const ErrorData *)` true swallows it (and
// this returns false), false raises it again unchanged. Memory context and
// resource owner are the caller's again in every case.
template <typename Body, typename Handled>
bool run_in_subtransaction(Body body, Handled handled) {
  // A longjmp out of body() skips destructors.
  static_assert(std::is_trivially_destructible_v<Body> &&
                std::is_trivially_destructible_v<Handled>);
  MemoryContext context = CurrentMemoryContext;
  ResourceOwner owner = CurrentResourceOwner;
  volatile bool finished = true;
  BeginInternalSubTransaction(nullptr);
  MemoryContextSwitchTo(context);
  PG_TRY();
  {
    body();
    ReleaseCurrentSubTransaction();
  }
  PG_CATCH();
  {
    MemoryContextSwitchTo(context);
    ErrorData *error = CopyErrorData();
    FlushErrorState();
    RollbackAndReleaseCurrentSubTransaction();
    MemoryContextSwitchTo(context);
    CurrentResourceOwner = owner;
    if (!handled(error))
      ReThrowError(error);
    FreeErrorData(error);
    finished = false;
  }
  PG_END_TRY();
  MemoryContextSwitchTo(context);
  CurrentResourceOwner = owner;
  return finished;
}

} // namespace idempotency
