// fn's arguments as bound to $1 ... $n, in palloc'd arrays.
#pragma once

#include "idempotency/pg.hpp"

namespace idempotency {

struct FnArgs {
  int count;
  Oid *types;
  Datum *values;
  bool *nulls;
};
static_assert(std::is_trivially_destructible_v<FnArgs>);

} // namespace idempotency
