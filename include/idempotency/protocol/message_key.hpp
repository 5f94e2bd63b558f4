// How a key is shown in an error message. The message travels in the
// client's encoding; a key character that encoding cannot represent would
// turn the error into another one (22P05, from the conversion), so such
// characters are escaped and the SQLSTATE never depends on client_encoding.
#pragma once

#include "idempotency/pg.hpp"
#include "idempotency/storage/key_store.hpp"

namespace idempotency::protocol {

// The key as a C string: as is where the client encoding can represent it;
// each character it cannot represent is written \uXXXX or \UXXXXXXXX (its
// Unicode code point) in a UTF8 database, else \xNN per byte. Looks up the
// conversion in the catalog: call it before ereport(), not inside it.
char *key_for_message(const text *key);

// key_for_message() of a key reference's text.
const char *key_text(const storage::KeyRef &key);

} // namespace idempotency::protocol
