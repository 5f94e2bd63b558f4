// The clients scenario from node-postgres (see test/clients/run): bare
// placeholders, JavaScript values as node-postgres sends them.
//   node scenario.js unnamed|named
'use strict';
const { Client } = require('pg');

const mode = process.argv[2];
const env = process.env;
const prefix = `${env.CLIENTS_RUN}-${env.CLIENTS_CONFIG}-`;
const account = Number(env.CLIENTS_ACCOUNT);
const stamp = new Date('2026-01-02T03:04:05Z');
const uuid = 'a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11';
const doc = { a: 1, b: [true, null] };

// In the `named` configuration, every statement a connection runs with
// values is a named (server-side prepared) statement.
function connection(client) {
  if (mode !== 'named') return client;
  const names = new Map();
  return {
    query(text, values) {
      if (values === undefined) return client.query(text);
      if (!names.has(text)) names.set(text, `s${names.size}`);
      return client.query({ name: names.get(text), text, values });
    },
  };
}

function result(step, field, value) {
  console.log(`RESULT ${step} ${field} ${value}`);
}

// docs:begin node-postgres
const CALL_WITHDRAW = `SELECT idempotency.idempotent_call($1, NULL, 'SELECT withdraw($1, $2)', $2, $3)::text AS response,
                              idempotency.last_call_replayed() AS replayed`;

async function withdraw(client, key, account, amount) {
  try {
    const { rows } = await client.query(CALL_WITHDRAW, [key, account, amount]);
    return rows[0]; // { response: '{"account": 7, "balance": 9700}', replayed: false }
  } catch (err) {
    if (err.code === 'IK409') throw new Error('busy: retry later with the same key (409)');
    if (err.code === 'IK422') throw new Error('key reused for another request (422)');
    throw err;
  }
}
// docs:end node-postgres

const CALL_TYPES = `SELECT idempotency.idempotent_call($1, NULL, 'SELECT record_types($1, $2, $3, $4, $5, $6)',
                                                 $2, $3, $4, $5, $6, $7)::text AS response,
                          idempotency.last_call_replayed() AS replayed`;

async function step(name, body) {
  try {
    await body();
  } catch (err) {
    result(name, 'error', `${err.code || ''} ${err.message}`.replace(/\n/g, ' '));
  }
}

async function reportCall(name, db, text, values) {
  await step(name, async () => {
    const { rows } = await db.query(text, values);
    result(name, 'response', rows[0].response);
    result(name, 'replayed', rows[0].replayed);
  });
}

async function main() {
  const client = new Client();
  const other = new Client({ application_name: 'clients-holder' });
  await client.connect();
  await other.connect();
  const db = connection(client);
  const otherDb = connection(other);

  const first = prefix + 'first';
  for (const name of ['first', 'retry']) {
    await step(name, async () => {
      const { response, replayed } = await withdraw(db, first, account + 1, 300);
      result(name, 'response', response);
      result(name, 'replayed', replayed);
    });
  }
  await step('conflict', async () => {
    try {
      await db.query(CALL_WITHDRAW, [first, account + 1, 301]);
    } catch (err) {
      result('conflict', 'sqlstate', err.code);
    }
  });

  await step('busy', async () => {
    const busy = prefix + 'busy';
    await other.query('BEGIN');
    try {
      await otherDb.query(CALL_WITHDRAW, [busy, account + 2, 100]);
      const started = process.hrtime.bigint();
      try {
        await db.query(CALL_WITHDRAW, [busy, account + 2, 100]);
      } catch (err) {
        result('busy', 'sqlstate', err.code);
      }
      result('busy', 'elapsed_ms', Number((process.hrtime.bigint() - started) / 1000000n));
    } finally {
      await other.query('COMMIT');
    }
    await reportCall('busy_after', db, CALL_WITHDRAW, [busy, account + 2, 100]);
  });

  await step('handler', async () => {
    const key = prefix + 'handler';
    await client.query('BEGIN');
    try {
      const claim = await db.query('SELECT replayed FROM idempotency.claim($1, $2)', [key, 'hash-1']);
      result('handler_claim', 'replayed', claim.rows[0].replayed);
      const work = await db.query('SELECT withdraw($1, $2)::text AS response', [account + 3, 50]);
      result('handler_work', 'response', work.rows[0].response);
      await db.query('SELECT idempotency.complete($1, $2)', [key, JSON.parse(work.rows[0].response)]);
      await client.query('COMMIT');
    } catch (err) {
      await client.query('ROLLBACK');
      throw err;
    }
    await client.query('BEGIN');
    const again = await db.query('SELECT replayed, response::text AS response FROM idempotency.claim($1, $2)', [key, 'hash-1']);
    await client.query('COMMIT');
    result('handler_again', 'replayed', again.rows[0].replayed);
    result('handler_again', 'response', again.rows[0].response);
  });

  await step('release', async () => {
    const key = prefix + 'release';
    await client.query('BEGIN');
    await db.query('SELECT replayed FROM idempotency.claim($1, $2)', [key, null]);
    await db.query('SELECT idempotency.release($1)', [key]);
    await client.query('COMMIT');
    const lookup = await db.query('SELECT state FROM idempotency.lookup($1)', [key]);
    result('release_lookup', 'state', lookup.rows[0].state);
    await client.query('BEGIN');
    const again = await db.query('SELECT replayed FROM idempotency.claim($1, $2)', [key, null]);
    await client.query('ROLLBACK');
    result('release_again', 'replayed', again.rows[0].replayed);
  });

  // Three keys, the second with a null request hash, in one transaction:
  // withdraw for each claimed key, the answers as node-postgres's array of
  // objects for jsonb[]. Then the batch again with the first key repeated
  // under another hash.
  const batchKeys = [0, 1, 2].map((i) => `${prefix}batch-${i}`);
  const batchHashes = ['hash-0', null, 'hash-2'];
  await step('batch', async () => {
    await client.query('BEGIN');
    try {
      const claims = await db.query('SELECT key, outcome FROM idempotency.claim_batch($1, $2) ORDER BY ordinality',
        [batchKeys, batchHashes]);
      const keys = [];
      const responses = [];
      for (const [i, claim] of claims.rows.entries()) {
        result(`batch.${i}`, 'outcome', claim.outcome);
        if (claim.outcome !== 'claimed') continue;
        const work = await db.query('SELECT withdraw($1, $2)::text AS response', [account + 6 + i, 10 * (i + 1)]);
        result(`batch.${i}`, 'response', work.rows[0].response);
        keys.push(claim.key);
        responses.push(JSON.parse(work.rows[0].response));
      }
      await db.query('SELECT idempotency.complete_batch($1, $2)', [keys, responses]);
      await client.query('COMMIT');
    } catch (err) {
      await client.query('ROLLBACK');
      throw err;
    }
  });
  await step('batch_retry', async () => {
    await client.query('BEGIN');
    const { rows } = await db.query(
      'SELECT outcome, sqlstate, response::text AS response FROM idempotency.claim_batch($1, $2) ORDER BY ordinality',
      [[...batchKeys, batchKeys[0]], [...batchHashes, 'hash-0-other']]);
    await client.query('COMMIT');
    for (const [i, row] of rows.entries()) {
      result(`batch_retry.${i}`, 'outcome', row.outcome);
      result(`batch_retry.${i}`, 'response', row.response);
      result(`batch_retry.${i}`, 'sqlstate', row.sqlstate);
    }
  });

  for (const name of ['types', 'types_retry']) {
    const key = prefix + 'types';
    await reportCall(name, db, CALL_TYPES, [key, key, true, stamp, uuid, doc, '12.50']);
  }
  for (const name of ['types_null', 'types_null_retry']) {
    const key = prefix + 'types-null';
    await reportCall(name, db, CALL_TYPES, [key, key, null, null, null, null, null]);
  }

  for (const [name, mode] of [['prepared', 'auto'], ['prepared_generic', 'force_generic_plan']]) {
    await step(name, async () => {
      await client.query(`SET plan_cache_mode = ${mode}`);
      const statement = { name: `call-withdraw-${mode}`, text: CALL_WITHDRAW };
      for (const pass of ['run', 'retry']) {
        for (let i = 0; i < 20; i++) {
          const { rows } = await client.query({ ...statement, values: [`${prefix}${name}-${i}`, account + (mode === 'auto' ? 4 : 5), i + 1] });
          result(`${name}.${pass}.${i}`, 'response', rows[0].response);
        }
      }
      await client.query('RESET plan_cache_mode');
    });
  }

  await reportCall('cross', db, CALL_WITHDRAW, [env.CLIENTS_CROSS_KEY, Number(env.CLIENTS_CROSS_ACCOUNT), 250]);
  await reportCall('cross_types', db, CALL_TYPES,
    [env.CLIENTS_CROSS_KEY + '-types', env.CLIENTS_CROSS_TAG, true, stamp, uuid, doc, '12.50']);

  await other.end();
  await client.end();
}

main().catch((err) => {
  console.error(err);
  process.exit(1);
});
