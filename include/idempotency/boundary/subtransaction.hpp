// Catching a PostgreSQL error without ending the transaction.
#pragma once

#include "idempotency/pg.hpp"

extern "C" {
#include "access/xact.h"
#include "utils/resowner.h"
}

namespace idempotency {

// Runs body() in an internal subtransaction, as a PL/pgSQL EXCEPTION block
// does; true when it finished. After an error, `handled(const ErrorData *)`
// true swallows it (this returns false), false raises it again unchanged.
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
