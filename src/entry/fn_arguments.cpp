#include "idempotency/entry/fn_arguments.hpp"

namespace idempotency::entry {

namespace {

void add_arg(FnArgs &args, Oid type, Datum value, bool is_null) {
  // An untyped literal arrives as a C string of type unknown; bind it as text.
  if (type == UNKNOWNOID) {
    type = TEXTOID;
    if (!is_null)
      value = CStringGetTextDatum(DatumGetCString(value));
  }
  args.types[args.count] = type;
  args.values[args.count] = value;
  args.nulls[args.count] = is_null;
  args.count++;
}

void allocate(FnArgs &args, int capacity) {
  args.count = 0;
  args.types = static_cast<Oid *>(palloc(sizeof(Oid) * Max(capacity, 1)));
  args.values = static_cast<Datum *>(palloc(sizeof(Datum) * Max(capacity, 1)));
  args.nulls = static_cast<bool *>(palloc(sizeof(bool) * Max(capacity, 1)));
}

FnArgs collect_variadic_array(FunctionCallInfo fcinfo, int position) {
  FnArgs args;
  if (PG_ARGISNULL(position)) {
    allocate(args, 0);
    return args;
  }
  ArrayType *array = PG_GETARG_ARRAYTYPE_P(position);
  Oid element_type = ARR_ELEMTYPE(array);
  int16 typlen;
  bool typbyval;
  char typalign;
  get_typlenbyvalalign(element_type, &typlen, &typbyval, &typalign);
  Datum *values;
  bool *nulls;
  int count;
  deconstruct_array(array, element_type, typlen, typbyval, typalign, &values,
                    &nulls, &count);
  allocate(args, count);
  for (int i = 0; i < count; i++)
    add_arg(args, element_type, values[i], nulls[i]);
  return args;
}

} // namespace

FnArgs fn_arguments(FunctionCallInfo fcinfo, int first) {
  if (PG_NARGS() > first && get_fn_expr_variadic(fcinfo->flinfo))
    return collect_variadic_array(fcinfo, first);
  FnArgs args;
  allocate(args, PG_NARGS() - first);
  for (int i = first; i < PG_NARGS(); i++)
    add_arg(args, get_fn_expr_argtype(fcinfo->flinfo, i), PG_GETARG_DATUM(i),
            PG_ARGISNULL(i));
  return args;
}

} // namespace idempotency::entry
