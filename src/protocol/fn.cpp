#include "idempotency/protocol/rules.hpp"
#include "idempotency/settings/sqlstate_list.hpp"

#include "idempotency/protocol/fn.hpp"
#include "idempotency/boundary/subtransaction.hpp"
#include "idempotency/settings/settings.hpp"

#include "idempotency/compat.hpp"

extern "C" {
#include "catalog/pg_type.h"
#include "common/hashfn.h"
#include "executor/executor.h"
#include "funcapi.h"
#include "nodes/makefuncs.h"
#include "nodes/nodeFuncs.h"
#include "nodes/params.h"
#include "parser/analyze.h"
#include "parser/parse_coerce.h"
#include "parser/parse_param.h"
#include "tcop/tcopprot.h"
#include "utils/array.h"
#include "utils/builtins.h"
#include "utils/datum.h"
#include "utils/fmgroids.h"
#include "utils/hsearch.h"
#include "utils/inval.h"
#include "utils/json.h"
#include "utils/lsyscache.h"
#include "utils/memutils.h"
#include "utils/syscache.h"
}

namespace idempotency::protocol {

// PostgreSQL's assignment cast (as INSERT applies it), or for a string
// argument the target type's input function (as for an untyped literal).
struct Conversion {
  ExprState *expression; // nullptr: passed as it is
  ExprContext *context;  // its one parameter, the argument
};
static_assert(std::is_trivially_destructible_v<Conversion>);

namespace {

// Cut to idempotency.debug_statement_hash_bits.
uint64 statement_hash(const char *sql, size_t sql_size, int nargs,
                      const Oid *types) {
  uint64 hash = hash_bytes_extended(
      reinterpret_cast<const unsigned char *>(sql), (int)sql_size, nargs);
  return hash_bytes_extended(reinterpret_cast<const unsigned char *>(types),
                             (int)(sizeof(Oid) * nargs), hash) &
         settings::statement_hash_mask();
}

// Parameter types (InvalidOid where open) and result column types.
struct Analysis {
  Oid *types;
  List *result_types;
};

// As PostgreSQL analyses a client's statement with untyped parameters, from
// `seed`; false, *out untouched, when that fails (an ambiguous operator, a
// relation created later) or in a parallel worker (no subtransaction there).
bool analyse(const char *sql, int nargs, const Oid *seed, Analysis *out) {
  if (IsInParallelMode())
    return false;
  Analysis result{static_cast<Oid *>(palloc(sizeof(Oid) * Max(nargs, 1))), NIL};
  memcpy(result.types, seed, sizeof(Oid) * nargs);
  int count = nargs;
  bool finished = run_in_subtransaction(
      [sql, &count, &result] {
        List *statements = pg_parse_query(sql);
        if (list_length(statements) != 1)
          ereport(ERROR, (errcode(ERRCODE_SYNTAX_ERROR),
                          errmsg("fn must be exactly one SQL statement")));
        ParseState *state = make_parsestate(nullptr);
        state->p_sourcetext = sql;
        setup_parse_variable_parameters(state, &result.types, &count);
        Query *query =
            transformTopLevelStmt(state, linitial_node(RawStmt, statements));
        check_variable_parameters(state, query);
        List *columns = query->commandType == CMD_SELECT ? query->targetList
                                                         : query->returningList;
        ListCell *cell;
        foreach (cell, columns) {
          TargetEntry *column = lfirst_node(TargetEntry, cell);
          if (!column->resjunk)
            result.result_types =
                lappend_oid(result.result_types,
                            exprType(reinterpret_cast<Node *>(column->expr)));
        }
        free_parsestate(state);
      },
      [](const ErrorData *) { return true; });
  if (!finished)
    return false;
  for (int i = 0; i < nargs; i++)
    if (i >= count || result.types[i] == UNKNOWNOID)
      result.types[i] = InvalidOid;
  *out = result;
  return true;
}

uint64 generation = 0;

void catalog_changed(Datum, compat::SysCacheIdentifier, uint32) {
  generation++;
}

// Counts changes to the catalogs deciding fn's parameter types or names.
uint64 parameter_types_generation() {
  static bool watching = false;
  if (!watching) {
    static const SysCacheIdentifier caches[] = {
        TYPEOID, NAMESPACEOID, PROCOID, OPEROID, CASTSOURCETARGET, ATTNUM};
    for (SysCacheIdentifier cache : caches)
      CacheRegisterSyscacheCallback(cache, catalog_changed, (Datum)0);
    watching = true;
  }
  return generation;
}

struct Inferred {
  uint64 hash; // the table's key
  char *sql;
  int nargs;
  Oid *given;
  Oid *types;
  uint64 generation;
};

// The backend's caches of parameter types and of statements, keyed by
// statement_hash(), each entry's first member; keys may share a hash, so
// callers check the full key. The limit only bounds one fn text per call.
constexpr long max_entries = 1024;
HTAB *inferred = nullptr;
HTAB *statements = nullptr;
MemoryContext caches_context = nullptr;

void create_caches() {
  if (statements != nullptr)
    return;
  caches_context = AllocSetContextCreate(
      TopMemoryContext, "idempotency statements", ALLOCSET_DEFAULT_SIZES);
  HASHCTL ctl{};
  ctl.keysize = sizeof(uint64);
  ctl.hcxt = caches_context;
  ctl.entrysize = sizeof(Inferred);
  inferred = hash_create("idempotency parameter types", 64, &ctl,
                         HASH_ELEM | HASH_BLOBS | HASH_CONTEXT);
  ctl.entrysize = sizeof(Statement);
  statements = hash_create("idempotency statements", 64, &ctl,
                           HASH_ELEM | HASH_BLOBS | HASH_CONTEXT);
}

// With every parameter open, else (`SELECT $1 + $2`) with the given types;
// a parameter still open is the given type, or text.
void infer(const char *sql, int nargs, const Oid *given, Oid *types) {
  Analysis analysis{static_cast<Oid *>(palloc0(sizeof(Oid) * Max(nargs, 1))),
                    NIL};
  if (analyse(sql, nargs, analysis.types, &analysis)) {
    // PostgreSQL types as text a parameter fn only passes on (`SELECT $1`);
    // the caller's non-string type stands if fn then returns other types.
    bool any = false;
    for (int i = 0; i < nargs; i++) {
      types[i] = analysis.types[i];
      if (types[i] == TEXTOID && OidIsValid(given[i]) &&
          TypeCategory(given[i]) != TYPCATEGORY_STRING) {
        types[i] = given[i];
        any = true;
      }
    }
    Analysis seeded{};
    if (any && analyse(sql, nargs, types, &seeded) &&
        !equal(analysis.result_types, seeded.result_types))
      analysis = seeded;
  } else {
    (void)analyse(sql, nargs, given, &analysis);
  }
  for (int i = 0; i < nargs; i++) {
    types[i] = analysis.types[i];
    if (!OidIsValid(types[i]))
      types[i] = OidIsValid(given[i]) ? given[i] : TEXTOID;
  }
}

// Raises 42804 when there is none.
Conversion conversion_between(Oid given, Oid target, int position) {
  Conversion conversion{};
  if (given == target)
    return conversion;

  Param *argument = makeNode(Param);
  argument->paramkind = PARAM_EXTERN;
  argument->paramid = 1;
  argument->paramtype = given;
  argument->paramtypmod = -1;
  argument->paramcollid = get_typcollation(given);
  argument->location = -1;
  CoercionContext context = TypeCategory(given) == TYPCATEGORY_STRING
                                ? COERCION_EXPLICIT
                                : COERCION_ASSIGNMENT;
  Node *converted =
      coerce_to_target_type(nullptr, reinterpret_cast<Node *>(argument), given,
                            target, -1, context, COERCE_IMPLICIT_CAST, -1);
  if (converted == nullptr)
    ereport(
        ERROR,
        (errcode(ERRCODE_DATATYPE_MISMATCH),
         errmsg("argument $%d of type %s cannot be converted to %s",
                position + 1, format_type_be(given), format_type_be(target)),
         errdetail("fn's text gives parameter $%d the type %s.", position + 1,
                   format_type_be(target)),
         errhint("Pass a value of type %s.", format_type_be(target))));

  ParamListInfo parameters = makeParamList(1);
  parameters->numParams = 1;
  parameters->params[0] =
      ParamExternData{(Datum)0, false, PARAM_FLAG_CONST, given};
  conversion.expression =
      ExecInitExprWithParams(reinterpret_cast<Expr *>(converted), parameters);
  conversion.context = CreateStandaloneExprContext();
  conversion.context->ecxt_param_list_info = parameters;
  return conversion;
}

template <typename T> T *allocate(MemoryContext context, int count) {
  return static_cast<T *>(
      MemoryContextAlloc(context, sizeof(T) * Max(count, 1)));
}

// What fn receives and what depends on it, set only once all that may fail
// has run; the generation is read first: a change meanwhile leaves it stale.
void describe(Statement &statement, text *fn, MemoryContext parent) {
  uint64 generation = parameter_types_generation();
  int nargs = statement.nargs;
  Oid *types = static_cast<Oid *>(palloc(sizeof(Oid) * Max(nargs, 1)));
  infer_parameter_types(statement.sql, nargs, statement.given_types, types);
  MemoryContext context = AllocSetContextCreate(parent, "idempotency statement",
                                                ALLOCSET_SMALL_SIZES);
  MemoryContext caller = MemoryContextSwitchTo(context);
  Statement described = statement;
  described.context = context;
  PG_TRY();
  {
    described.types = allocate<Oid>(context, nargs);
    memcpy(described.types, types, sizeof(Oid) * nargs);
    described.conversions = allocate<Conversion>(context, nargs);
    described.converts = false;
    described.encoders = allocate<fingerprint::ValueEncoder>(context, nargs);
    for (int i = 0; i < nargs; i++) {
      described.conversions[i] =
          conversion_between(statement.given_types[i], types[i], i);
      described.converts |= described.conversions[i].expression != nullptr;
      described.encoders[i] = fingerprint::encoder_for(types[i]);
    }
    described.fingerprint_prefix = fingerprint::prefix_for(fn, nargs, types);
    described.fingerprint_prefix.keep_prefix_state();
  }
  PG_CATCH();
  {
    MemoryContextSwitchTo(caller);
    MemoryContextDelete(context);
    PG_RE_THROW();
  }
  PG_END_TRY();
  described.catalog_generation = generation;
  // A statement whose types changed is planned again. The old plan is not
  // freed: a call further up this backend's stack may still be running it.
  if (statement.plan != nullptr &&
      memcmp(types, statement.types, sizeof(Oid) * nargs) != 0)
    described.plan = nullptr;
  MemoryContextSwitchTo(caller);
  if (statement.context != nullptr)
    MemoryContextDelete(statement.context);
  statement = described;
}

// Positions a parser error in fn's text, as SPI does, not in the caller's.
void position_in_fn(void *sql) {
  int position = geterrposition();
  if (position <= 0)
    return;
  errposition(0);
  internalerrposition(position);
  internalerrquery(static_cast<const char *>(sql));
}

// to_jsonb() learns its argument's type from fn_expr: a typed placeholder.
Datum to_jsonb_of(Datum value, Oid type) {
  FmgrInfo flinfo;
  fmgr_info(F_TO_JSONB, &flinfo);
  List *call_args = list_make1(makeNullConst(type, -1, InvalidOid));
  flinfo.fn_expr = reinterpret_cast<Node *>(
      makeFuncExpr(F_TO_JSONB, JSONBOID, call_args, InvalidOid, InvalidOid,
                   COERCE_EXPLICIT_CALL));
  return FunctionCall1(&flinfo, value);
}

Datum row_to_jsonb(HeapTuple row, TupleDesc desc) {
  if (row_is_object(desc->natts))
    return to_jsonb_of(heap_copy_tuple_as_datum(row, desc), RECORDOID);
  bool is_null;
  Datum value = SPI_getbinval(row, desc, 1, &is_null);
  if (is_null)
    return DirectFunctionCall1(jsonb_in, CStringGetDatum("null"));
  return to_jsonb_of(value, SPI_gettypeid(desc, 1));
}

Datum result_to_jsonb(SPITupleTable *table, uint64 rows, bool *is_null) {
  int columns = table == nullptr ? 0 : table->tupdesc->natts;
  ResultShape shape = result_shape(rows, columns);
  *is_null = shape == ResultShape::no_response;
  if (*is_null)
    return (Datum)0;
  // Rows become records, which to_jsonb finds through a blessed descriptor.
  if (row_is_object(columns))
    BlessTupleDesc(table->tupdesc);
  if (shape != ResultShape::array)
    return row_to_jsonb(table->vals[0], table->tupdesc);
  if (rows > (uint64)MaxArraySize)
    ereport(ERROR, (errcode(ERRCODE_PROGRAM_LIMIT_EXCEEDED),
                    errmsg("fn returned too many rows for one response")));
  auto *elements = static_cast<Datum *>(palloc(sizeof(Datum) * rows));
  for (uint64 i = 0; i < rows; i++)
    elements[i] = row_to_jsonb(table->vals[i], table->tupdesc);
  ArrayType *array =
      construct_array(elements, (int)rows, JSONBOID, -1, false, TYPALIGN_INT);
  return to_jsonb_of(PointerGetDatum(array), JSONBARRAYOID);
}

Datum run_fn(Statement &statement, const FnArgs &args, bool *is_null) {
  MemoryContext result_context = CurrentMemoryContext;
  // SPI_connect, SPI_prepare and SPI_keepplan raise their own errors here.
  SPI_connect();
  if (statement.plan == nullptr) {
    // Counted before anything is analysed: a later statement could fail on
    // what an earlier one would have created.
    ErrorContextCallback in_fn{error_context_stack, position_in_fn,
                               statement.sql};
    error_context_stack = &in_fn;
    List *parsed = pg_parse_query(statement.sql);
    error_context_stack = in_fn.previous;
    if (list_length(parsed) != 1)
      ereport(ERROR, (errcode(ERRCODE_SYNTAX_ERROR),
                      errmsg("fn must be exactly one SQL statement")));
    statement.plan =
        SPI_prepare(statement.sql, statement.nargs, statement.types);
    // A statement that is not kept gets a plan that SPI_finish frees.
    if (statement.kept)
      SPI_keepplan(statement.plan);
  }
  auto *nulls = static_cast<char *>(palloc(Max(args.count, 1)));
  for (int i = 0; i < args.count; i++)
    nulls[i] = args.nulls[i] ? 'n' : ' ';
  int rc = SPI_execute_plan(statement.plan, args.values, nulls, false, 0);
  // SPI refuses some statements by return code rather than by error.
  if (rc == SPI_ERROR_TRANSACTION)
    ereport(ERROR,
            (errcode(ERRCODE_INVALID_TRANSACTION_TERMINATION),
             errmsg("fn cannot commit, roll back or otherwise control the "
                    "transaction"),
             errdetail("fn runs inside the caller's transaction, which "
                       "commits or rolls back the key with it.")));
  if (rc == SPI_ERROR_COPY)
    ereport(ERROR, (errcode(ERRCODE_FEATURE_NOT_SUPPORTED),
                    errmsg("fn cannot run COPY to or from the client")));
  if (rc < 0)
    elog(ERROR, "running fn failed: %s", SPI_result_code_string(rc));

  // The response outlives the SPI connection.
  MemoryContext spi_context = MemoryContextSwitchTo(result_context);
  Datum response = result_to_jsonb(SPI_tuptable, SPI_processed, is_null);
  MemoryContextSwitchTo(spi_context);
  SPI_finish();
  return response;
}

Datum error_document(const ErrorData *error) {
  const char *members[][2] = {{"sqlstate", unpack_sql_state(error->sqlerrcode)},
                              {"message", error->message},
                              {"detail", error->detail},
                              {"hint", error->hint}};
  StringInfoData json;
  initStringInfo(&json);
  appendStringInfoString(&json, "{\"error\": {");
  for (int i = 0; i < 4; i++) {
    appendStringInfo(&json, "%s\"%s\": ", i == 0 ? "" : ", ", members[i][0]);
    if (members[i][1] == nullptr)
      appendStringInfoString(&json, "null");
    else
      escape_json(&json, members[i][1]);
  }
  appendStringInfoString(&json, "}}");
  return DirectFunctionCall1(jsonb_in, CStringGetDatum(json.data));
}

} // namespace

void infer_parameter_types(const char *sql, int nargs, const Oid *given,
                           Oid *types) {
  uint64 at = parameter_types_generation();
  uint64 hash = statement_hash(sql, strlen(sql), nargs, given);
  create_caches();
  auto *found =
      static_cast<Inferred *>(hash_search(inferred, &hash, HASH_FIND, nullptr));
  if (found != nullptr && found->nargs == nargs &&
      strcmp(found->sql, sql) == 0 &&
      memcmp(found->given, given, sizeof(Oid) * nargs) == 0 &&
      found->generation == at) {
    memcpy(types, found->types, sizeof(Oid) * nargs);
    return;
  }
  infer(sql, nargs, given, types);
  if (hash_get_num_entries(inferred) >= max_entries)
    return;
  // One allocation: the given types, the types, then the text.
  Size oids = sizeof(Oid) * nargs;
  auto *copy = static_cast<char *>(
      MemoryContextAlloc(caches_context, 2 * oids + strlen(sql) + 1));
  memcpy(copy, given, oids);
  memcpy(copy + oids, types, oids);
  memcpy(copy + 2 * oids, sql, strlen(sql) + 1);
  bool existed;
  auto *entry = static_cast<Inferred *>(
      hash_search(inferred, &hash, HASH_ENTER, &existed));
  if (existed)
    pfree(entry->given);
  Oid *kept = reinterpret_cast<Oid *>(copy);
  *entry = Inferred{hash, copy + 2 * oids, nargs, kept, kept + nargs, at};
}

Statement *statement_for(text *fn, const FnArgs &args) {
  create_caches();
  const char *sql = VARDATA_ANY(fn);
  size_t sql_size = VARSIZE_ANY_EXHDR(fn);
  uint64 hash = statement_hash(sql, sql_size, args.count, args.types);

  auto *found = static_cast<Statement *>(
      hash_search(statements, &hash, HASH_FIND, nullptr));
  if (found != nullptr && found->nargs == args.count &&
      strlen(found->sql) == sql_size &&
      memcmp(found->sql, sql, sql_size) == 0 &&
      memcmp(found->given_types, args.types, sizeof(Oid) * args.count) == 0) {
    if (found->catalog_generation != parameter_types_generation())
      describe(*found, fn, caches_context);
    return found;
  }

  // Not kept: the cache is full, or another statement has the same hash.
  bool kept =
      found == nullptr && hash_get_num_entries(statements) < max_entries;
  MemoryContext context = kept ? caches_context : CurrentMemoryContext;
  Oid *given_types = allocate<Oid>(context, args.count);
  memcpy(given_types, args.types, sizeof(Oid) * args.count);
  // describe() fills in everything after given_types.
  char *sql_copy = MemoryContextStrdup(context, text_to_cstring(fn));
  fingerprint::RequestFingerprint unset =
      fingerprint::RequestFingerprint::for_claim();
  Statement built{hash,    sql_copy, args.count, given_types, nullptr,
                  nullptr, nullptr,  false,      unset,       nullptr,
                  nullptr, kept,     0};
  describe(built, fn, context);
  auto *entry = static_cast<Statement *>(
      kept ? hash_search(statements, &hash, HASH_ENTER, nullptr)
           : palloc(sizeof(Statement)));
  *entry = built;
  return entry;
}

FnArgs received_args(const Statement &statement, const FnArgs &args) {
  if (!statement.converts)
    return args;
  FnArgs received = args;
  received.types = statement.types;
  received.values = allocate<Datum>(CurrentMemoryContext, args.count);
  received.nulls = allocate<bool>(CurrentMemoryContext, args.count);
  for (int i = 0; i < args.count; i++) {
    received.nulls[i] = args.nulls[i];
    received.values[i] = args.values[i];
    const Conversion &conversion = statement.conversions[i];
    if (args.nulls[i] || conversion.expression == nullptr)
      continue;
    conversion.context->ecxt_param_list_info->params[0].value = args.values[i];
    // In the caller's memory context, where it must live; a cast may give NULL.
    received.values[i] = ExecEvalExpr(conversion.expression, conversion.context,
                                      &received.nulls[i]);
  }
  return received;
}

Datum run_fn_storing_errors(Statement &statement, const FnArgs &args,
                            bool *is_null, bool *is_error) {
  *is_error = false;
  if (settings::stored_errors().count == 0)
    return run_fn(statement, args, is_null);

  Datum response = (Datum)0;
  run_in_subtransaction(
      [&] { response = run_fn(statement, args, is_null); },
      [&](const ErrorData *error) {
        const char *sqlstate = unpack_sql_state(error->sqlerrcode);
        if (!sqlstate_listed(settings::stored_errors(), sqlstate) ||
            sqlstate_transient(sqlstate))
          return false;
        response = error_document(error);
        *is_null = false;
        *is_error = true;
        return true;
      });
  return response;
}

} // namespace idempotency::protocol
