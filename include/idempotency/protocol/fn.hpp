// fn: the caller's one SQL statement - the types its parameters receive
// and each argument's conversion to them, what is kept per statement, how
// it runs, how its result becomes the stored jsonb response, and the errors
// it may store in its place.
#pragma once

#include "idempotency/fingerprint/request_hash.hpp"

#include "idempotency/fingerprint/fn_args.hpp"
#include "idempotency/pg.hpp"

extern "C" {
#include "executor/spi.h"
}

namespace idempotency::protocol {

// --- what fn receives --------------------------------------------------------
//
// The types fn's own text gives its parameters, and the conversion of each
// argument to them.
//
// A request is identified by what fn receives, not by how a driver labelled
// its values on the wire: `SELECT withdraw($1, $2)` with withdraw(integer,
// bigint) receives an integer and a bigint whether the client sent int2,
// int8, varchar or an untyped '300'. The types are PostgreSQL's own answer
// for untyped parameters (what a client that prepares fn with no types
// would be told); a parameter whose type fn leaves open keeps the type the
// caller gave it (an untyped one is text). docs/fingerprints.md states the
// rule for users.

// Fills types[0 .. nargs) for fn's `sql`. given[i] is the caller's type of
// argument i, or InvalidOid when the caller left it untyped:
//  1. fn analysed with every parameter open gives the types;
//  2. except that a parameter fn only passes on to its result (`SELECT $1`,
//     `ARRAY[$1, $2]`), which PostgreSQL would make text by default, keeps
//     the caller's type;
//  3. when fn cannot be analysed with its parameters open (`SELECT $1 + $2`),
//     fn analysed with the given types gives the types of the others;
//  4. a parameter still open is the given type, or text.
// Never raises for what fn's text says: an fn that cannot be analysed
// raises its own error when it is prepared to run. The answer is kept per
// fn text and given types for the life of the backend (up to a bound), until
// a catalog that decides the types changes (fn.cpp's generation): a client's
// statement with untyped parameters that is parsed for every call (an
// unnamed statement) asks again each time.
void infer_parameter_types(const char *sql, int nargs, const Oid *given,
                           Oid *types);

// --- the statement -----------------------------------------------------------
//
// Kept per fn statement - fn's text with the types its caller gave the
// arguments - for the life of the backend: the types fn receives and how
// each argument converts to them (above), the request fingerprint's prefix
// (fn and the received types, hashed), how to encode each value, and the
// prepared plan. A statement is analysed, planned and
// fingerprinted once per backend rather than once per call; PostgreSQL's
// plan cache revalidates the plan after DDL or a change of search_path or
// role, and a change to the catalogs that decide fn's parameter types or
// their names (types, schemas, functions, operators, casts, columns) makes
// the statement work them out again on next use, so every backend answers
// alike.

struct Conversion; // how each argument becomes what fn receives (fn.cpp)

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

// The statement of fn with these arguments' types. Past the cache's size
// limit the statement is built afresh for each call in the current memory
// context. Entries are never freed, so a statement (and its plan) stays
// valid while fn runs, even if fn makes calls of its own.
Statement *statement_for(text *fn, const FnArgs &args);

// The arguments as fn receives them: `args` itself when nothing converts.
FnArgs received_args(const Statement &statement, const FnArgs &args);

// --- stored errors -----------------------------------------------------------
//
// With idempotency.store_errors set, an error of a listed SQLSTATE raised
// by fn is the call's outcome. fn then runs in a subtransaction, so that
// the error undoes fn's effects while the caller's transaction goes on to
// store the error as the response:
//
//   {"error": {"sqlstate": "P0001", "message": "...", "detail": null,
//              "hint": null}}
//
// With the setting empty fn runs as it always did, without a subtransaction.

// Runs fn - the statement's plan, prepared on first use - with the caller's
// rights, through SPI, and returns its result as jsonb in the current memory
// context (see docs/how-it-works.md, "Result to jsonb"); *is_null is set when
// fn returned no rows. With idempotency.store_errors set, an error of a
// listed SQLSTATE is caught, fn's effects are rolled back, and its document
// is returned with *is_error set; any other error propagates unchanged.
Datum run_fn_storing_errors(Statement &statement, const FnArgs &args,
                            bool *is_null, bool *is_error);

// Whether a stored response is an error document of the shape above.
bool is_error_document(Datum response, bool response_is_null);

} // namespace idempotency::protocol
