'use strict';
// Refunds made safe to retry. A refund pays money out, so running it twice
// is the costly kind of duplicate: each refund carries an idempotency key
// naming that one refund (a support ticket, a refund request id, the saga
// step it compensates), and every retry repeats the key.
//
//   node refund.js refund KEY PAYMENT_ID AMOUNT   one refund, retried safely
//   node refund.js compensate TRANSFER_ID         undo a failed transfer
//
// Connection settings come from PGHOST, PGDATABASE, PGUSER, ... Prints the
// refund as JSON. Exit status: 0 refunded (or replayed), 2 invalid key or
// usage, 3 the key was used for a different refund, 4 refund refused (no
// such payment, or more than is left), 1 anything else.

const { Pool } = require('pg');

const RETRYABLE = new Set([
  'IK409', // the same refund is running in another transaction right now
  '40001', // serialization failure
  '40P01', // deadlock detected
]);
const EXIT = { ok: 0, failed: 1, invalidKey: 2, keyReused: 3, refused: 4 };
const EXIT_FOR_SQLSTATE = {
  '22023': EXIT.invalidKey, // empty or over-long key
  '22004': EXIT.invalidKey, // null key
  IK422: EXIT.keyReused,
  RF422: EXIT.refused, // raised by refund(): more than is left
  P0002: EXIT.refused, // raised by refund(): no such payment
};
const MAX_ATTEMPTS = 10;

const CALL_REFUND = `
  SELECT idempotency.idempotent_call($1, NULL, 'SELECT refund($1, $2)',
                                     $2::bigint, $3::bigint) AS response`;

const sleep = (ms) => new Promise((resolve) => setTimeout(resolve, ms));

function backoffMs(attempt) {
  const ceiling = Math.min(20 * 2 ** attempt, 1000);
  return ceiling / 2 + Math.random() * (ceiling / 2);
}

async function refundOnce(pool, key, paymentId, amount) {
  const client = await pool.connect();
  let broken;
  try {
    await client.query('BEGIN');
    const { rows } = await client.query(CALL_REFUND, [key, paymentId, amount]);
    const replay = await client.query('SELECT idempotency.last_call_replayed() AS replayed');
    await client.query('COMMIT');
    return { refund: rows[0].response, replayed: replay.rows[0].replayed };
  } catch (error) {
    await client.query('ROLLBACK').catch((rollbackError) => { broken = rollbackError; });
    throw error;
  } finally {
    client.release(broken);
  }
}

// Pays one refund, or replays it if it was paid before under this key.
// Retries what is safe to retry: with the key, "try again" never pays twice.
async function refund(pool, { key, paymentId, amount }) {
  for (let attempt = 1; ; attempt++) {
    try {
      return await refundOnce(pool, key, paymentId, amount);
    } catch (error) {
      if (!RETRYABLE.has(error.code) || attempt >= MAX_ATTEMPTS)
        throw error;
      await sleep(backoffMs(attempt));
    }
  }
}

// Compensates a transfer whose payout failed: refunds its payment in full,
// then records the transfer as compensated. The saga's state is written in
// a transaction of its own (as it would be in an orchestrator's own store),
// so a crash in between leaves the refund paid and the transfer not marked;
// running the compensation again then replays the refund instead of paying
// it twice, because its key is derived from the transfer.
async function compensate(pool, transferId) {
  const { rows } = await pool.query(
    `SELECT t.payment_id, p.amount FROM transfers t JOIN payments p ON p.id = t.payment_id
      WHERE t.id = $1`, [transferId]);
  if (rows.length === 0)
    throw Object.assign(new Error(`transfer ${transferId} does not exist`), { code: 'P0002' });
  const result = await refund(pool, {
    key: `compensate-transfer:${transferId}`, paymentId: rows[0].payment_id, amount: rows[0].amount,
  });
  await pool.query("UPDATE transfers SET status = 'compensated' WHERE id = $1", [transferId]);
  return result;
}

function usage() {
  console.error('usage: node refund.js refund KEY PAYMENT_ID AMOUNT\n' +
                '       node refund.js compensate TRANSFER_ID');
  return EXIT.invalidKey;
}

async function main(argv) {
  const [command, ...args] = argv;
  const pool = new Pool({ max: 1, application_name: 'refund-example' });
  try {
    let result;
    if (command === 'refund' && args.length === 3)
      result = await refund(pool, { key: args[0], paymentId: args[1], amount: args[2] });
    else if (command === 'compensate' && args.length === 1)
      result = await compensate(pool, args[0]);
    else
      return usage();
    console.log(JSON.stringify(result));
    return EXIT.ok;
  } catch (error) {
    console.error(`refund failed: ${error.code ?? ''} ${error.message}`);
    return EXIT_FOR_SQLSTATE[error.code] ?? EXIT.failed;
  } finally {
    await pool.end();
  }
}

if (require.main === module)
  main(process.argv.slice(2)).then((status) => { process.exitCode = status; });

module.exports = { refund, compensate };
