#include "idempotency/protocol/backend_table.hpp"
#include "idempotency/settings/settings.hpp"

extern "C" {
#include "common/hashfn.h"
}

namespace idempotency::protocol {

HTAB *create_backend_table(const char *name, Size entry_size,
                           MemoryContext context) {
  HASHCTL ctl;
  memset(&ctl, 0, sizeof(ctl));
  ctl.keysize = sizeof(uint64);
  ctl.entrysize = entry_size;
  ctl.hcxt = context;
  return hash_create(name, 64, &ctl, HASH_ELEM | HASH_BLOBS | HASH_CONTEXT);
}

uint64 statement_hash(const char *sql, size_t sql_size, int nargs,
                      const Oid *types) {
  uint64 hash = hash_bytes_extended(
      reinterpret_cast<const unsigned char *>(sql), (int)sql_size, nargs);
  return hash_bytes_extended(reinterpret_cast<const unsigned char *>(types),
                             (int)(sizeof(Oid) * nargs), hash) &
         settings::statement_hash_mask();
}

} // namespace idempotency::protocol
