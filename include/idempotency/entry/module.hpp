// What _PG_init (entry/module.cpp) installs from entry/, once per process.
#pragma once

namespace idempotency::entry {

// The transaction and subtransaction callbacks (src/entry/transaction.cpp).
void register_transaction_callbacks();

// After parse analysis, gives the untyped parameters ($n of type 0, as most
// drivers send them) of the extension's calls a type: in fn's variadic
// arguments the one fn's text gives (else `"any"` decides nothing and the
// statement fails with 42P18), a tenant its column's, anything else text.
// Only with the library preloaded (shared_ or session_preload_libraries).
void install_untyped_parameters_hook();

} // namespace idempotency::entry
