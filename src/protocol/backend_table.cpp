#include "idempotency/protocol/backend_table.hpp"

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

} // namespace idempotency::protocol
