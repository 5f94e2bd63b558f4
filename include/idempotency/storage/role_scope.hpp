// The SQL type idempotency.role_scope: a role's OID inside the cluster, its
// name in text and binary I/O (see role_scope.cpp). Bodies of the type's
// I/O functions, declared in entry/functions.cpp.
#pragma once

#include "idempotency/pg.hpp"

namespace idempotency::storage {

Datum role_scope_in(FunctionCallInfo fcinfo);
Datum role_scope_out(FunctionCallInfo fcinfo);
Datum role_scope_recv(FunctionCallInfo fcinfo);
Datum role_scope_send(FunctionCallInfo fcinfo);

} // namespace idempotency::storage
