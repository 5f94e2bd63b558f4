// The boundary between server-free units and PostgreSQL, checked by the
// compiler.
//
// Server-free units (protocol/rules, settings/sqlstate_list,
// storage/citus_version, entry/server_version) build without PostgreSQL's
// headers: they are linked into the unit tests, and they are where C++
// types with destructors may live. (The header of fingerprint/fingerprint is
// server-free too; its .cpp hashes with OpenSSL or PostgreSQL's
// pg_cryptohash.) Each of their headers includes this file as its last
// include, and each of their .cpp files includes it again after everything
// else. No include guard, on purpose: every inclusion checks again, so the
// build fails
//  - when a server-free unit includes a PostgreSQL header, before or after
//    its own header, and
//  - when a server unit includes a server-free header after pg.hpp, whose
//    macros (Min, Max, printf, ...) break the standard headers it uses.
#if defined(POSTGRES_H) || defined(C_H) || defined(PG_VERSION_NUM)
#error                                                                         \
    "PostgreSQL headers included before a server-free header: server-free units (idempotency/server_free.hpp) include none, and server units include server-free headers before pg.hpp"
#endif
