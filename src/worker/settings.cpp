#include "worker/settings.hpp"

#include "pg.hpp"

namespace idempotency::worker::settings {

namespace {

constexpr int default_interval_seconds = 60;
constexpr int default_batch_size = 1000;
// A batch is one transaction; its keys stay locked until it commits, so it
// must stay short whatever is configured.
constexpr int max_batch_size = 100000;

int interval_seconds = default_interval_seconds;
int batch_size = default_batch_size;
// Flat out, the worker takes a whole core from the callers; 5 ms after each
// batch of 1000 still deletes over 100k keys a second (see README, Expiry).
int batch_delay_ms = 5;

} // namespace

void define() {
  DefineCustomIntVariable(
      "idempotency.expire_interval",
      "Time the expiry worker sleeps between rounds.",
      "Each round deletes the expired keys of every database where the "
      "extension is installed. 0 turns the worker off.",
      &interval_seconds, default_interval_seconds, 0, INT_MAX, PGC_SIGHUP,
      GUC_UNIT_S, nullptr, nullptr, nullptr);

  DefineCustomIntVariable(
      "idempotency.expire_batch_size",
      "Expired keys examined per batch; the worker commits each batch.",
      "Smaller batches hold fewer row locks for less time; larger ones "
      "finish a backlog with fewer transactions.",
      &batch_size, default_batch_size, 1, max_batch_size, PGC_SUSET, 0, nullptr,
      nullptr, nullptr);

  DefineCustomIntVariable(
      "idempotency.expire_batch_delay",
      "Pause of the expiry worker after each batch.",
      "Spreads the deletion of a large backlog over time, leaving CPU and "
      "I/O to callers; 0 goes on at once.",
      &batch_delay_ms, 5, 0, 10000, PGC_SUSET, GUC_UNIT_MS, nullptr, nullptr,
      nullptr);
}

int expire_interval_seconds() { return interval_seconds; }

int expire_batch_size() { return batch_size; }

int expire_batch_delay_ms() { return batch_delay_ms; }

} // namespace idempotency::worker::settings
