#include "worker/worker.hpp"

#include "pg.hpp"

namespace idempotency::worker {

void register_launcher() {}

} // namespace idempotency::worker
