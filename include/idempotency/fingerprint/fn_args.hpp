// fn's arguments as bound to $1 ... $n: collected by entry/functions, hashed
// by fingerprint/request_hash, keyed on by protocol/fn. A plain
// struct over palloc'd arrays, so it may live in frames that call
// PostgreSQL.
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
