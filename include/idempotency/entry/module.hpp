// What _PG_init (entry/module.cpp) installs from the other files of entry/,
// once per process.
#pragma once

namespace idempotency::entry {

// What happens when a transaction or subtransaction ends: the extension's
// one transaction callback and one subtransaction callback
// (src/entry/transaction.cpp lists every part they call, in order).
void register_transaction_callbacks();

// Untyped parameters of the extension's calls get their types from fn.
//
// Most drivers send a statement's parameters untyped and let the server
// decide ($n with type 0): node-postgres, asyncpg, pgx, ruby-pg, pgjdbc's
// setNull. An argument of a `"any"` slot decides nothing, so
//   SELECT idempotency.idempotent_call($1, NULL, 'SELECT withdraw($1, $2)', $2,
//   $3)
// would fail with 42P18. After parse analysis, this hook gives each such
// parameter the type fn's own text gives the matching parameter of fn
// (withdraw's integer and bigint); a tenant the type of the tenant column;
// anything else text. The client learns the types from the server, as for
// any statement, and sends its values accordingly.
//
// A hook only works where the library is loaded: shared_preload_libraries
// (the documented installation) or session_preload_libraries loads it
// before a session's first statement.
void install_untyped_parameters_hook();

} // namespace idempotency::entry
