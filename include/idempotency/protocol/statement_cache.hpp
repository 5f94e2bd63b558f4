// What is kept per fn statement - fn's text with the types its caller gave
// the arguments - for the life of the backend: the types fn receives and how
// each argument converts to them (protocol/fn), the request
// fingerprint's prefix (fn and the received types, hashed), how to encode
// each value, and the prepared plan. A statement is analysed, planned and
// fingerprinted once per backend rather than once per call; PostgreSQL's
// plan cache revalidates the plan after DDL or a change of search_path or
// role, and a change to the catalogs that decide fn's parameter types or
// their names (types, schemas, functions, operators, casts, columns) makes
// the statement work them out again on next use, so every backend answers
// alike.
#pragma once

#include "idempotency/fingerprint/request_hash.hpp"

#include "idempotency/fingerprint/fn_args.hpp"
#include "idempotency/pg.hpp"
#include "idempotency/protocol/fn.hpp"

extern "C" {
#include "executor/spi.h"
}

namespace idempotency::protocol {

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

// The statement's plan, prepared on first use. Raises 42601 unless fn is
// exactly one statement. Needs an SPI connection.
SPIPlanPtr plan_of(Statement &statement);

} // namespace idempotency::protocol
