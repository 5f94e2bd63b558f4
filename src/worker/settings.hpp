// The expiry worker's configuration parameters (GUCs).
#pragma once

namespace idempotency::worker::settings {

// Defines the idempotency.expire_* settings;
// called from _PG_init, preloaded or not, so that expire() and SHOW see them.
void define();

// idempotency.expire_interval: seconds the launcher sleeps between rounds;
// 0 turns the worker off (idempotency.expire() still works).
int expire_interval_seconds();

// idempotency.expire_batch_size: how many expired keys one batch (one short
// transaction of the worker) examines at most.
int expire_batch_size();

// idempotency.expire_batch_delay: milliseconds the worker pauses after each
// batch, to spread the work of a large backlog; 0 (the default) goes on at
// once.
int expire_batch_delay_ms();

} // namespace idempotency::worker::settings
