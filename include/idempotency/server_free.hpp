// Server-free units (linked into the unit tests, and the only place for C++
// types with destructors) build without PostgreSQL's headers. Each of their
// headers includes this file last, and each .cpp again after everything
// else; no include guard, so every inclusion fails the build when a
// PostgreSQL header came first (in a server unit: when a server-free header
// follows pg.hpp, whose macros break the standard headers).
#if defined(POSTGRES_H) || defined(C_H) || defined(PG_VERSION_NUM)
#error                                                                         \
    "PostgreSQL headers included before a server-free header: server-free units (idempotency/server_free.hpp) include none, and server units include server-free headers before pg.hpp"
#endif
