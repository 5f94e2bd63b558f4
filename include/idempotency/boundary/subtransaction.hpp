// Catching a PostgreSQL error without ending the transaction: the body runs
// in an internal subtransaction, as a PL/pgSQL block with an EXCEPTION
// clause does, so an error undoes only what the body did.
#pragma once

#include "idempotency/pg.hpp"

extern "C" {
#include "access/xact.h"
#include "utils/resowner.h"
}

namespace idempotency {

// Runs body(). Returns true when it finished. When it raised an error, its
// subtransaction is rolled back and `handled(const ErrorData *)` decides:
// true swallows the error (the function returns false), false raises it
// again unchanged, SQLSTATE and all. Memory context and resource owner are
// the caller's again in every case.
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
