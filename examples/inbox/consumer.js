'use strict';
// A queue consumer that applies each message exactly once (the inbox
// pattern): at-least-once delivery + an idempotent receiver.
//
//   PGHOST=... PGDATABASE=... PGUSER=... node consumer.js [--batch N] [--drain]
//
// It leases a batch of deliveries with FOR UPDATE SKIP LOCKED (so several
// consumers share the queue), applies each message in its own transaction
// through idempotency.idempotent_call with the message id as the key, and
// acknowledges the batch (deletes the deliveries) when the whole batch is
// done. Effects commit before the ack, as with any broker whose ack is not
// part of the database transaction; so a consumer that dies before its ack
// gets the batch redelivered, and the keys turn the redelivered messages
// into replays. Prints one JSON line per message processed.
//
// --drain: exit when a lease finds nothing (deliveries leased by other
// consumers are skipped, not waited for) instead of polling forever.

const { Client } = require('pg');

const RETRYABLE = new Set([
  'IK409', // the message is being applied by another consumer right now
  '40001', // serialization failure
  '40P01', // deadlock detected
]);
const MAX_ATTEMPTS = 30;
const POLL_INTERVAL_MS = 500;

const LEASE_BATCH = `
  SELECT delivery_id, message_id, payload FROM queue
   ORDER BY delivery_id LIMIT $1 FOR UPDATE SKIP LOCKED`;
const ACK_BATCH = 'DELETE FROM queue WHERE delivery_id = ANY($1::bigint[])';
const APPLY_MESSAGE = `
  SELECT idempotency.idempotent_call($1, NULL, 'SELECT ship_order($1, $2, $3)',
                                     $2::bigint, $3::text, $4::integer)`;

const sleep = (ms) => new Promise((resolve) => setTimeout(resolve, ms));

// Exponential backoff with jitter, so consumers that collided on a key do
// not collide again in lockstep.
function backoffMs(attempt) {
  const ceiling = Math.min(10 * 2 ** attempt, 500);
  return ceiling / 2 + Math.random() * (ceiling / 2);
}

// Applies one message in its own transaction; returns whether it had been
// applied before (the stored response was replayed).
async function applyMessage(work, message) {
  const { order_id: orderId, sku, quantity } = message.payload;
  for (let attempt = 1; ; attempt++) {
    try {
      await work.query('BEGIN');
      await work.query(APPLY_MESSAGE, [message.message_id, orderId, sku, quantity]);
      const { rows } = await work.query('SELECT idempotency.last_call_replayed() AS replayed');
      await work.query('COMMIT');
      return rows[0].replayed;
    } catch (error) {
      await work.query('ROLLBACK');
      if (!RETRYABLE.has(error.code) || attempt >= MAX_ATTEMPTS)
        throw error;
      await sleep(backoffMs(attempt));
    }
  }
}

// Leases, applies and acknowledges one batch; returns its size.
async function consumeBatch(queue, work, batchSize) {
  await queue.query('BEGIN');
  const { rows: deliveries } = await queue.query(LEASE_BATCH, [batchSize]);
  for (const delivery of deliveries) {
    const replayed = await applyMessage(work, delivery);
    console.log(JSON.stringify({
      delivery_id: Number(delivery.delivery_id), message_id: delivery.message_id, replayed,
    }));
  }
  await queue.query(ACK_BATCH, [deliveries.map((delivery) => delivery.delivery_id)]);
  await queue.query('COMMIT');
  return deliveries.length;
}

function parseArguments(argv) {
  const options = { batchSize: 50, drain: false };
  for (let i = 0; i < argv.length; i++) {
    if (argv[i] === '--drain')
      options.drain = true;
    else if (argv[i] === '--batch' && Number.isInteger(Number(argv[i + 1])) && Number(argv[i + 1]) > 0)
      options.batchSize = Number(argv[++i]);
    else
      throw new Error(`usage: node consumer.js [--batch N] [--drain] (unexpected: ${argv[i]})`);
  }
  return options;
}

async function main() {
  const { batchSize, drain } = parseArguments(process.argv.slice(2));
  // One connection holds the lease, the other commits the effects.
  const queue = new Client({ application_name: 'inbox-consumer' });
  const work = new Client({ application_name: 'inbox-consumer' });
  await queue.connect();
  await work.connect();
  try {
    for (;;) {
      const consumed = await consumeBatch(queue, work, batchSize);
      if (consumed > 0)
        continue;
      if (drain)
        break;
      await sleep(POLL_INTERVAL_MS);
    }
  } finally {
    await Promise.allSettled([queue.end(), work.end()]);
  }
}

if (require.main === module) {
  main().catch((error) => {
    console.error(`consumer failed: ${error.code ?? ''} ${error.message}`);
    process.exit(1);
  });
}
