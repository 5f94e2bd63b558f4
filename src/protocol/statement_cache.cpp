#include "idempotency/protocol/statement_cache.hpp"

#include "idempotency/protocol/backend_table.hpp"

extern "C" {
#include "tcop/tcopprot.h"
#include "utils/inval.h"
#include "utils/memutils.h"
}

namespace idempotency::protocol {

namespace {

// Applications have a handful of fn texts; this only bounds a pathological
// caller (one fn text per call). Beyond it statements are not kept.
constexpr long max_statements = 1024;

HTAB *statements = nullptr;
MemoryContext statements_context = nullptr;

bool matches(const Statement &statement, const char *sql, size_t sql_size,
             const FnArgs &args) {
  return statement.nargs == args.count && strlen(statement.sql) == sql_size &&
         memcmp(statement.sql, sql, sql_size) == 0 &&
         memcmp(statement.given_types, args.types, sizeof(Oid) * args.count) ==
             0;
}

void create_table() {
  statements_context = AllocSetContextCreate(
      TopMemoryContext, "idempotency statements", ALLOCSET_DEFAULT_SIZES);
  statements = create_backend_table("idempotency statements", sizeof(Statement),
                                    statements_context);
}

template <typename T> T *allocate(MemoryContext context, int count) {
  return static_cast<T *>(
      MemoryContextAlloc(context, sizeof(T) * Max(count, 1)));
}

bool same_types(const Oid *a, const Oid *b, int count) {
  return memcmp(a, b, sizeof(Oid) * count) == 0;
}

// Fills the fingerprint prefix and encoders from the statement's types.
void fingerprint_types(Statement &statement, text *fn) {
  for (int i = 0; i < statement.nargs; i++)
    statement.encoders[i] = fingerprint::encoder_for(statement.types[i]);
  statement.fingerprint_prefix =
      fingerprint::prefix_for(fn, statement.nargs, statement.types);
  statement.fingerprint_prefix.keep_prefix_state();
}

// Works out, in a new memory context under `parent`, what fn receives and
// how each argument gets there; everything that may fail runs before the
// statement changes. The generation is read first: a change that arrives
// meanwhile leaves the statement stale, described again on next use.
void describe(Statement &statement, text *fn, const Oid *types,
              MemoryContext parent) {
  uint64 generation = parameter_types_generation();
  MemoryContext context = AllocSetContextCreate(parent, "idempotency statement",
                                                ALLOCSET_SMALL_SIZES);
  MemoryContext caller = MemoryContextSwitchTo(context);
  Statement described = statement;
  described.context = context;
  PG_TRY();
  {
    described.types = allocate<Oid>(context, statement.nargs);
    memcpy(described.types, types, sizeof(Oid) * statement.nargs);
    described.conversions = allocate<Conversion>(context, statement.nargs);
    described.converts = false;
    for (int i = 0; i < statement.nargs; i++) {
      described.conversions[i] =
          conversion_between(statement.given_types[i], types[i], i);
      described.converts |= described.conversions[i].expression != nullptr;
    }
    described.encoders =
        allocate<fingerprint::ValueEncoder>(context, statement.nargs);
    fingerprint_types(described, fn);
  }
  PG_CATCH();
  {
    MemoryContextSwitchTo(caller);
    MemoryContextDelete(context);
    PG_RE_THROW();
  }
  PG_END_TRY();
  described.catalog_generation = generation;
  MemoryContextSwitchTo(caller);
  if (statement.context != nullptr)
    MemoryContextDelete(statement.context);
  statement = described;
}

Oid *inferred_types(const Statement &statement) {
  Oid *types =
      static_cast<Oid *>(palloc(sizeof(Oid) * Max(statement.nargs, 1)));
  infer_parameter_types(statement.sql, statement.nargs, statement.given_types,
                        types);
  return types;
}

// After a catalog change: the types again; a statement whose types are
// unchanged keeps its conversions and plan and only names its types again.
void refresh(Statement &statement, text *fn) {
  uint64 generation = parameter_types_generation();
  Oid *types = inferred_types(statement);
  if (!same_types(types, statement.types, statement.nargs)) {
    // The old plan is left to its memory context, not freed: a call further
    // up this backend's stack may still be running it.
    describe(statement, fn, types, statements_context);
    statement.plan = nullptr;
    return;
  }
  // The prefixes' bytes and kept states live with the statement.
  MemoryContext caller = MemoryContextSwitchTo(statement.context);
  fingerprint_types(statement, fn);
  MemoryContextSwitchTo(caller);
  statement.catalog_generation = generation;
}

Statement build(uint64 hash, text *fn, const FnArgs &args, bool kept,
                MemoryContext context) {
  size_t sql_size = VARSIZE_ANY_EXHDR(fn);
  char *sql = allocate<char>(context, (int)sql_size + 1);
  memcpy(sql, VARDATA_ANY(fn), sql_size);
  sql[sql_size] = '\0';
  Oid *given_types = allocate<Oid>(context, args.count);
  memcpy(given_types, args.types, sizeof(Oid) * args.count);
  // describe() fills in everything after given_types.
  fingerprint::RequestFingerprint unset =
      fingerprint::RequestFingerprint::for_claim();
  Statement statement{hash,    sql,     args.count, given_types, nullptr,
                      nullptr, nullptr, false,      unset,       nullptr,
                      nullptr, kept,    0};
  describe(statement, fn, inferred_types(statement), context);
  return statement;
}

} // namespace

Statement *statement_for(text *fn, const FnArgs &args) {
  if (statements == nullptr)
    create_table();
  const char *sql = VARDATA_ANY(fn);
  size_t sql_size = VARSIZE_ANY_EXHDR(fn);
  uint64 hash = statement_hash(sql, sql_size, args.count, args.types);

  auto *found = static_cast<Statement *>(
      hash_search(statements, &hash, HASH_FIND, nullptr));
  if (found != nullptr && matches(*found, sql, sql_size, args)) {
    if (found->catalog_generation != parameter_types_generation())
      refresh(*found, fn);
    return found;
  }

  // Not kept: the cache is full, or another statement has the same hash.
  if (found != nullptr || hash_get_num_entries(statements) >= max_statements) {
    auto *transient = static_cast<Statement *>(palloc(sizeof(Statement)));
    *transient = build(hash, fn, args, false, CurrentMemoryContext);
    return transient;
  }

  Statement built = build(hash, fn, args, true, statements_context);
  auto *entry = static_cast<Statement *>(
      hash_search(statements, &hash, HASH_ENTER, nullptr));
  *entry = built;
  return entry;
}

FnArgs received_args(const Statement &statement, const FnArgs &args) {
  if (!statement.converts)
    return args;
  FnArgs received = args;
  received.types = statement.types;
  received.values =
      static_cast<Datum *>(palloc(sizeof(Datum) * Max(args.count, 1)));
  received.nulls =
      static_cast<bool *>(palloc(sizeof(bool) * Max(args.count, 1)));
  for (int i = 0; i < args.count; i++) {
    received.nulls[i] = args.nulls[i];
    received.values[i] = args.values[i];
    if (!args.nulls[i] && statement.conversions[i].expression != nullptr)
      received.values[i] =
          convert(statement.conversions[i], args.values[i], &received.nulls[i]);
  }
  return received;
}

namespace {

// An error the parser positions is positioned in fn's text, with fn as its
// QUERY, as SPI does for the statements it parses (its error context
// callback): without this, the cursor would point into the caller's
// statement.
void position_in_fn(void *sql) {
  int position = geterrposition();
  if (position <= 0)
    return;
  errposition(0);
  internalerrposition(position);
  internalerrquery(static_cast<const char *>(sql));
}

// Counted on the raw parse trees, before anything is analysed: analysing a
// later statement could fail on what an earlier one would have created
// (CREATE TABLE t ...; SELECT * FROM t would answer 42P01).
void check_single_statement(const char *sql) {
  ErrorContextCallback in_fn{error_context_stack, position_in_fn,
                             const_cast<char *>(sql)};
  error_context_stack = &in_fn;
  List *statements = pg_parse_query(sql);
  error_context_stack = in_fn.previous;
  if (list_length(statements) != 1)
    ereport(ERROR, (errcode(ERRCODE_SYNTAX_ERROR),
                    errmsg("fn must be exactly one SQL statement")));
}

} // namespace

SPIPlanPtr plan_of(Statement &statement) {
  if (statement.plan != nullptr)
    return statement.plan;
  check_single_statement(statement.sql);
  SPIPlanPtr plan =
      SPI_prepare(statement.sql, statement.nargs, statement.types);
  if (plan == nullptr)
    elog(ERROR, "SPI_prepare failed for fn: %s",
         SPI_result_code_string(SPI_result));
  // A statement that is not kept gets a plan that SPI_finish frees.
  if (statement.kept && SPI_keepplan(plan) != 0)
    elog(ERROR, "SPI_keepplan failed for fn");
  statement.plan = plan;
  return plan;
}

} // namespace idempotency::protocol
