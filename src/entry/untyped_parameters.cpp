#include "idempotency/protocol/fn.hpp"

#include "idempotency/entry/module.hpp"
#include "idempotency/pg.hpp"
#include "idempotency/storage/key_store.hpp"
#include "idempotency/storage/tenant_keys.hpp"

#include "idempotency/compat.hpp"

extern "C" {
#include "access/htup_details.h"
#include "access/xact.h"
#include "catalog/pg_proc.h"
#include "catalog/pg_type.h"
#include "commands/extension.h"
#include "funcapi.h"
#include "nodes/nodeFuncs.h"
#include "parser/analyze.h"
#include "parser/parse_node.h"
#include "parser/parse_param.h"
#include "utils/builtins.h"
#include "utils/lsyscache.h"
#include "utils/syscache.h"
}

namespace idempotency::entry {

namespace {

// Calls `visit` on each node after its children, subqueries included. The
// walkers take bool (*)(); casting via void (*)() says the change is meant.
template <typename Context, void (*visit)(Node *, Context *)>
bool walk(Node *node, Context *context) {
  if (node == nullptr)
    return false;
  auto *walker = reinterpret_cast<bool (*)()>(
      reinterpret_cast<void (*)()>(walk<Context, visit>));
  if (IsA(node, Query))
    return query_tree_walker(reinterpret_cast<Query *>(node), walker, context,
                             0);
  bool walked = expression_tree_walker(node, walker, context);
  visit(node, context);
  return walked;
}

post_parse_analyze_hook_type previous_post_parse_analyze_hook = nullptr;

using compat::VariableParameters;

// The coerce-param hook of statements with variable parameter types, learned
// at load from setup_parse_variable_parameters' parse state; nullptr (then
// placeholders stay untyped) when it is not laid out as VariableParameters.
CoerceParamHook variable_parameters_hook = nullptr;

bool is_untyped(const Node *node) {
  return node != nullptr && IsA(node, Param) &&
         reinterpret_cast<const Param *>(node)->paramkind == PARAM_EXTERN &&
         reinterpret_cast<const Param *>(node)->paramtype == UNKNOWNOID;
}

struct Search {
  Query *statement;
  Oid schema;                     // the extension's
  VariableParameters *parameters; // the statement's
};

// Parameter $id now has `type`, and so has every untyped use of it.
struct Retyping {
  int id;
  Oid type;
};

void retype(Node *node, Retyping *retyping) {
  auto *param = reinterpret_cast<Param *>(node);
  if (!is_untyped(node) || param->paramid != retyping->id)
    return;
  param->paramtype = retyping->type;
  param->paramtypmod = -1;
  param->paramcollid = get_typcollation(retyping->type);
}

// The types fn gives the variadic arguments from `first` on, or nullptr when
// fn is not a literal known now (a parameter itself).
Oid *fn_types(const List *args, int fn_position, int first) {
  if (fn_position < 0)
    return nullptr;
  const Node *fn = static_cast<const Node *>(list_nth(args, fn_position));
  if (!IsA(fn, Const) || reinterpret_cast<const Const *>(fn)->constisnull ||
      reinterpret_cast<const Const *>(fn)->consttype != TEXTOID)
    return nullptr;
  int count = list_length(args) - first;
  Oid *given = static_cast<Oid *>(palloc(sizeof(Oid) * Max(count, 1)));
  for (int i = 0; i < count; i++) {
    Oid type = exprType(static_cast<const Node *>(list_nth(args, first + i)));
    given[i] = type == UNKNOWNOID ? InvalidOid : type;
  }
  Oid *types = static_cast<Oid *>(palloc(sizeof(Oid) * Max(count, 1)));
  protocol::infer_parameter_types(
      TextDatumGetCString(reinterpret_cast<const Const *>(fn)->constvalue),
      count, given, types);
  return types;
}

// A call of the extension's functions.
void type_call(Node *node, Search *search) {
  auto *call = reinterpret_cast<FuncExpr *>(node);
  if (!IsA(node, FuncExpr) ||
      get_func_namespace(call->funcid) != search->schema)
    return;
  Oid *declared_types;
  char **names;
  char *modes;
  HeapTuple proc = SearchSysCache1(PROCOID, ObjectIdGetDatum(call->funcid));
  if (!HeapTupleIsValid(proc))
    elog(ERROR, "cache lookup failed for function %u", call->funcid);
  int declared = get_func_arg_info(proc, &declared_types, &names, &modes);
  bool variadic =
      OidIsValid(reinterpret_cast<Form_pg_proc>(GETSTRUCT(proc))->provariadic);
  ReleaseSysCache(proc);
  // An explicit VARIADIC array passes typed values.
  int first_variadic = variadic && !call->funcvariadic ? declared - 1 : -1;
  int fn_position = -1;
  int tenant_position = -1;
  for (int i = 0; names != nullptr && i < declared; i++) {
    if (strcmp(names[i], "fn") == 0)
      fn_position = i;
    if (strcmp(names[i], "tenant") == 0)
      tenant_position = i;
  }
  Oid *types = nullptr;
  bool types_known = false;
  for (int i = 0; i < list_length(call->args); i++) {
    auto *arg = static_cast<Node *>(list_nth(call->args, i));
    if (!is_untyped(arg))
      continue;
    Oid type = TEXTOID;
    if (i == tenant_position) {
      type = storage::tenant_keys::tenant_type();
    } else if (first_variadic >= 0 && i >= first_variadic) {
      if (!types_known) {
        types = fn_types(call->args, fn_position, first_variadic);
        types_known = true;
      }
      if (types != nullptr)
        type = types[i - first_variadic];
    }
    Retyping retyping{reinterpret_cast<Param *>(arg)->paramid, type};
    if (retyping.id < 1 || retyping.id > *search->parameters->count)
      continue;
    (*search->parameters->types)[retyping.id - 1] = type;
    walk<Retyping, retype>(reinterpret_cast<Node *>(search->statement),
                           &retyping);
  }
}

void type_untyped_parameters(ParseState *state, Query *statement,
                             compat::JumbleStateArgument jumble) {
  if (previous_post_parse_analyze_hook != nullptr)
    previous_post_parse_analyze_hook(state, statement, jumble);
  // Cheap tests first: this runs for every statement of the session.
  if (variable_parameters_hook == nullptr ||
      state->p_coerce_param_hook != variable_parameters_hook ||
      state->p_ref_hook_state == nullptr)
    return;
  auto *parameters = static_cast<VariableParameters *>(state->p_ref_hook_state);
  int first_untyped = 0;
  while (first_untyped < *parameters->count &&
         (*parameters->types)[first_untyped] != UNKNOWNOID)
    first_untyped++;
  if (first_untyped == *parameters->count || !IsTransactionState() ||
      !OidIsValid(get_extension_oid("idempotency", true)))
    return;
  // The extension is not relocatable: its schema is idempotency.
  Search search{statement, storage::schema::oid(true), parameters};
  walk<Search, type_call>(reinterpret_cast<Node *>(statement), &search);
}

} // namespace

void install_untyped_parameters_hook() {
  Oid *types = nullptr;
  int count = 0;
  ParseState *state = make_parsestate(nullptr);
  setup_parse_variable_parameters(state, &types, &count);
  auto *parameters = static_cast<VariableParameters *>(state->p_ref_hook_state);
  if (parameters != nullptr && parameters->types == &types &&
      parameters->count == &count)
    variable_parameters_hook = state->p_coerce_param_hook;
  else
    ereport(WARNING,
            (errmsg("idempotency cannot type untyped placeholders on this "
                    "server: its parser's variable parameter state is not "
                    "the one the library was built for"),
             errhint("Cast each argument of idempotent_call, or update the "
                     "library.")));
  free_parsestate(state);
  previous_post_parse_analyze_hook = post_parse_analyze_hook;
  post_parse_analyze_hook = type_untyped_parameters;
}

} // namespace idempotency::entry
