// What is kept per fn statement - fn's text with its argument types - for
// the life of the backend: the request fingerprint's prefix (fn and the type
// names, hashed), how to encode each argument, and the prepared plan. A
// statement is parsed, planned and fingerprinted once per backend rather
// than once per call; PostgreSQL's plan cache revalidates the plan after
// DDL or a change of search_path or role, and a change to pg_type or
// pg_namespace (a renamed type or schema) makes the statement compute its
// fingerprint prefix and encoders again on next use.
#pragma once

#include "fingerprint/request_hash.hpp"

#include "fingerprint/fn_args.hpp"
#include "pg.hpp"

namespace idempotency::protocol {

struct Statement {
  uint64 hash; // the cache's key
  char *sql;
  int nargs;
  Oid *types;
  fingerprint::RequestFingerprint fingerprint_prefix;
  fingerprint::ValueEncoder *encoders;
  SPIPlanPtr plan;           // nullptr until fn first runs
  bool kept;                 // in the cache; false past its size limit
  uint64 catalog_generation; // when fingerprint_prefix and encoders were made
};
static_assert(std::is_trivially_destructible_v<Statement>);

// The statement of fn with these arguments' types. Past the cache's size
// limit the statement is built afresh for each call in the current memory
// context. Entries are never freed, so a statement (and its plan) stays
// valid while fn runs, even if fn makes calls of its own.
Statement *statement_for(text *fn, const FnArgs &args);

// The statement's plan, prepared on first use. Raises 42601 unless fn is
// exactly one statement. Needs an SPI connection.
SPIPlanPtr plan_of(Statement &statement);

} // namespace idempotency::protocol
