// fn, the caller's one SQL statement: its parameter types, how it runs, and
// its result or stored error as the jsonb response.
#pragma once

#include "idempotency/fingerprint/request_hash.hpp"

#include "idempotency/fingerprint/fn_args.hpp"
#include "idempotency/pg.hpp"

extern "C" {
#include "executor/spi.h"
}

namespace idempotency::protocol {

// The types fn's `sql` gives its parameters (docs/fingerprints.md); given[i]
// is the caller's type of argument i, InvalidOid when untyped. Never raises
// for fn's text (fn raises its own error when prepared). Kept until a catalog
// deciding them changes: a client's unnamed statement asks on every call.
void infer_parameter_types(const char *sql, int nargs, const Oid *given,
                           Oid *types);

struct Conversion; // how each argument becomes what fn receives (fn.cpp)

// Kept per fn text and caller's argument types for the backend's life; redone
// when a catalog deciding fn's parameter types changes, so backends agree.
struct Statement {
  uint64 hash; // the cache's key
  char *sql;
  int nargs;
  Oid *given_types; // the caller's types, part of the key
  // What fn receives, and what depends on it; in `context`.
  MemoryContext context;
  Oid *types;
  Conversion *conversions;
  bool converts; // some argument is converted
  fingerprint::RequestFingerprint fingerprint_prefix;
  fingerprint::ValueEncoder *encoders;
  SPIPlanPtr plan;           // nullptr until fn first runs
  bool kept;                 // in the cache; false past its size limit
  uint64 catalog_generation; // when the parts above were worked out
};
static_assert(std::is_trivially_destructible_v<Statement>);

// Entries are never freed, so a statement (and its plan) stays valid while
// fn runs, even if fn makes calls of its own.
Statement *statement_for(text *fn, const FnArgs &args);

// The arguments as fn receives them: `args` itself when nothing converts.
FnArgs received_args(const Statement &statement, const FnArgs &args);

// fn's result as jsonb; *is_null when fn returned no rows. With store_errors
// set, fn runs in a subtransaction; a listed error undoes fn's effects and
// is returned as {"error": {"sqlstate", "message", "detail", "hint"}}.
Datum run_fn_storing_errors(Statement &statement, const FnArgs &args,
                            bool *is_null, bool *is_error);

} // namespace idempotency::protocol
