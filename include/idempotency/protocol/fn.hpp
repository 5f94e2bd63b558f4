// fn: the caller's one SQL statement - the types its parameters receive,
// what is kept per statement, how it runs, how its result becomes the stored
// jsonb response, and the errors it may store in its place.
#pragma once

#include "idempotency/fingerprint/request_hash.hpp"

#include "idempotency/fingerprint/fn_args.hpp"
#include "idempotency/pg.hpp"

extern "C" {
#include "executor/spi.h"
}

namespace idempotency::protocol {

// Fills types[0 .. nargs) with the types fn's `sql` gives its parameters, so
// that a request is identified by what fn receives, not by how a driver
// labelled its values (docs/fingerprints.md). given[i] is the caller's type
// of argument i, InvalidOid when untyped:
//  1. fn analysed with every parameter open gives the types;
//  2. except that a parameter fn only passes on to its result (`SELECT $1`),
//     which PostgreSQL would make text, keeps the caller's type;
//  3. when fn cannot be analysed with its parameters open (`SELECT $1 + $2`),
//     fn analysed with the given types gives the types of the others;
//  4. a parameter still open is the given type, or text.
// Never raises for what fn's text says: such an fn raises its own error when
// it is prepared to run. Answers are kept per backend until a catalog that
// decides the types changes, since a client's unnamed statement with
// untyped parameters asks again for every call.
void infer_parameter_types(const char *sql, int nargs, const Oid *given,
                           Oid *types);

struct Conversion; // how each argument becomes what fn receives (fn.cpp)

// Kept per fn text and caller's argument types for the life of the backend,
// so that a statement is analysed, planned and fingerprinted once. The plan
// cache revalidates the plan after DDL or a change of search_path or role;
// a change to the catalogs that decide fn's parameter types makes the
// statement work them out again on next use, so every backend answers alike.
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

// Past the cache's size limit the statement is built afresh in the current
// memory context. Entries are never freed, so a statement (and its plan)
// stays valid while fn runs, even if fn makes calls of its own.
Statement *statement_for(text *fn, const FnArgs &args);

// The arguments as fn receives them: `args` itself when nothing converts.
FnArgs received_args(const Statement &statement, const FnArgs &args);

// Runs fn with the caller's rights through SPI and returns its result as
// jsonb in the current memory context; *is_null when fn returned no rows.
// With idempotency.store_errors set, fn runs in a subtransaction, and an
// error of a listed SQLSTATE rolls back fn's effects and is returned as
// {"error": {"sqlstate": ..., "message": ..., "detail": ..., "hint": ...}}
// with *is_error set; any other error propagates unchanged.
Datum run_fn_storing_errors(Statement &statement, const FnArgs &args,
                            bool *is_null, bool *is_error);

// Whether a stored response is an error document of the shape above.
bool is_error_document(Datum response, bool response_is_null);

} // namespace idempotency::protocol
