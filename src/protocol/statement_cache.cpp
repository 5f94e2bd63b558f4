#include "protocol/statement_cache.hpp"

extern "C" {
#include "common/hashfn.h"
#include "utils/inval.h"
}

namespace idempotency::protocol {

namespace {

// Applications have a handful of fn texts; this only bounds a pathological
// caller (one fn text per call). Beyond it statements are not kept.
constexpr long max_statements = 1024;

HTAB *statements = nullptr;
MemoryContext statements_context = nullptr;

// Counts changes to pg_type and pg_namespace seen by this backend. The
// fingerprint names the argument types schema-qualified, so a renamed type
// or schema changes it: a statement fingerprinted before such a change
// computes its types' part again, and every backend answers alike.
uint64 catalog_generation = 0;

void catalog_changed(Datum, int, uint32) { catalog_generation++; }

uint64 hash_of(const char *sql, size_t sql_size, const FnArgs &args) {
  uint64 hash =
      hash_bytes_extended(reinterpret_cast<const unsigned char *>(sql),
                          (int)sql_size, (uint64)args.count);
  return hash_bytes_extended(
      reinterpret_cast<const unsigned char *>(args.types),
      (int)(sizeof(Oid) * args.count), hash);
}

bool matches(const Statement &statement, const char *sql, size_t sql_size,
             const FnArgs &args) {
  return statement.nargs == args.count && strlen(statement.sql) == sql_size &&
         memcmp(statement.sql, sql, sql_size) == 0 &&
         memcmp(statement.types, args.types, sizeof(Oid) * args.count) == 0;
}

void create_table() {
  statements_context = AllocSetContextCreate(
      TopMemoryContext, "idempotency statements", ALLOCSET_DEFAULT_SIZES);
  HASHCTL ctl;
  memset(&ctl, 0, sizeof(ctl));
  ctl.keysize = sizeof(uint64);
  ctl.entrysize = sizeof(Statement);
  ctl.hcxt = statements_context;
  statements = hash_create("idempotency statements", 64, &ctl,
                           HASH_ELEM | HASH_BLOBS | HASH_CONTEXT);
  CacheRegisterSyscacheCallback(TYPEOID, catalog_changed, (Datum)0);
  CacheRegisterSyscacheCallback(NAMESPACEOID, catalog_changed, (Datum)0);
}

// The part of the fingerprint that depends on fn and the argument types,
// with the catalog generation it was computed at; fills in how to encode
// each argument. The generation is read first: a change that arrives during
// the lookups leaves the statement stale, fingerprinted again on next use.
struct TypesFingerprint {
  fingerprint::RequestFingerprint prefix;
  uint64 generation;
};

TypesFingerprint fingerprint_types(text *fn, const FnArgs &args,
                                   fingerprint::ValueEncoder *encoders) {
  uint64 generation = catalog_generation;
  for (int i = 0; i < args.count; i++)
    encoders[i] = fingerprint::encoder_for(args.types[i]);
  return TypesFingerprint{fingerprint::prefix_for(fn, args), generation};
}

// A statement with its copies in `context`; everything that may fail (type
// lookups) runs before the statement is published.
Statement build(uint64 hash, text *fn, const FnArgs &args, bool kept,
                MemoryContext context) {
  size_t sql_size = VARSIZE_ANY_EXHDR(fn);
  int slots = Max(args.count, 1);
  auto *encoders = static_cast<fingerprint::ValueEncoder *>(
      MemoryContextAlloc(context, sizeof(fingerprint::ValueEncoder) * slots));
  char *sql = static_cast<char *>(MemoryContextAlloc(context, sql_size + 1));
  memcpy(sql, VARDATA_ANY(fn), sql_size);
  sql[sql_size] = '\0';
  auto *types =
      static_cast<Oid *>(MemoryContextAlloc(context, sizeof(Oid) * slots));
  memcpy(types, args.types, sizeof(Oid) * args.count);

  TypesFingerprint fingerprinted = fingerprint_types(fn, args, encoders);
  return Statement{hash,
                   sql,
                   args.count,
                   types,
                   fingerprinted.prefix,
                   encoders,
                   nullptr,
                   kept,
                   fingerprinted.generation};
}

} // namespace

Statement *statement_for(text *fn, const FnArgs &args) {
  if (statements == nullptr)
    create_table();
  const char *sql = VARDATA_ANY(fn);
  size_t sql_size = VARSIZE_ANY_EXHDR(fn);
  uint64 hash = hash_of(sql, sql_size, args);

  auto *found = static_cast<Statement *>(
      hash_search(statements, &hash, HASH_FIND, nullptr));
  if (found != nullptr && matches(*found, sql, sql_size, args)) {
    if (found->catalog_generation != catalog_generation) {
      TypesFingerprint fingerprinted =
          fingerprint_types(fn, args, found->encoders);
      found->fingerprint_prefix = fingerprinted.prefix;
      found->catalog_generation = fingerprinted.generation;
    }
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

namespace {

// Counted on the raw parse trees, before anything is analysed: analysing a
// later statement could fail on what an earlier one would have created
// (CREATE TABLE t ...; SELECT * FROM t would answer 42P01).
void check_single_statement(const char *sql) {
  if (list_length(pg_parse_query(sql)) != 1)
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
