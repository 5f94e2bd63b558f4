'use strict';
// The node-postgres helpers against a real database: claim, complete and
// release in the caller's transaction, and withIdempotency.

const { test, before, after } = require('node:test');
const assert = require('node:assert/strict');
const { randomUUID } = require('node:crypto');
const {
  claim, complete, release, withIdempotency, KeyInProgressError, KeyGoneError, KeyReusedError, InvalidKeyError,
  SealedError,
} = require('..');
const { createPool, SHORT_TTL, waitUntilGone } = require('./helpers');

let pool;

async function count(text) {
  const { rows: [row] } = await pool.query('SELECT count(*)::int AS n FROM node_jobs WHERE text = $1', [text]);
  return row.n;
}

before(async () => {
  pool = createPool(4);
  await pool.query('CREATE TABLE IF NOT EXISTS node_jobs (text text NOT NULL)');
});
after(() => pool.end());

test('claim, complete and commit in the caller\'s transaction; a later claim replays', async () => {
  const key = randomUUID();
  const client = await pool.connect();
  try {
    await client.query('BEGIN');
    const first = await claim(client, key, 'hash-1');
    assert.equal(first.replayed, false);
    await client.query('INSERT INTO node_jobs VALUES ($1)', [key]);
    await complete(client, key, { done: key });
    await client.query('COMMIT');
    await client.query('BEGIN');
    const again = await claim(client, key, 'hash-1');
    assert.equal(again.replayed, true);
    assert.deepEqual(again.response, { done: key });
    assert.ok(again.createdAt instanceof Date);
    await assert.rejects(claim(client, key, 'hash-2'), KeyReusedError);
    await client.query('ROLLBACK');
  } finally {
    client.release();
  }
  assert.equal(await count(key), 1);
});

test('release lets the key go while the transaction commits other work', async () => {
  const key = randomUUID();
  const client = await pool.connect();
  try {
    await client.query('BEGIN');
    await claim(client, key, null);
    await client.query('INSERT INTO node_jobs VALUES ($1)', [key]);
    await release(client, key);
    await client.query('COMMIT');
  } finally {
    client.release();
  }
  assert.equal(await count(key), 1);
  const { rows: [row] } = await pool.query('SELECT state FROM idempotency.lookup($1)', [key]);
  assert.equal(row.state, 'absent');
});

test('claim errors: in progress, invalid key; waitTimeout waits for the holder', async () => {
  const key = randomUUID();
  const holder = await pool.connect();
  const other = await pool.connect();
  try {
    await holder.query('BEGIN');
    await claim(holder, key, 'h');
    await other.query('BEGIN');
    const error = await claim(other, key, 'h').catch((e) => e);
    assert.ok(error instanceof KeyInProgressError);
    assert.equal(error.status, 409);
    assert.equal(error.cause.code, 'IK409');
    await other.query('ROLLBACK');

    await other.query('BEGIN');
    const waiting = claim(other, key, 'h', { waitTimeout: '10s' });
    await new Promise((resolve) => setTimeout(resolve, 200));
    await complete(holder, key, { by: 'holder' });
    await holder.query('COMMIT');
    const replayed = await waiting;
    assert.equal(replayed.replayed, true);
    assert.deepEqual(replayed.response, { by: 'holder' });
    await other.query('COMMIT');

    await other.query('BEGIN');
    const badTimeout = await claim(other, randomUUID(), 'h', { waitTimeout: '2 parsecs' }).catch((e) => e);
    assert.equal(badTimeout.code, '22023', 'the server\'s own error for the setting');
    assert.ok(!(badTimeout instanceof InvalidKeyError), 'a bad wait timeout is not an invalid key');
    await other.query('ROLLBACK');

    await other.query('BEGIN');
    await assert.rejects(claim(other, '', 'h'), InvalidKeyError);
    await other.query('ROLLBACK');
    await other.query('BEGIN');
    await assert.rejects(claim(other, 'k'.repeat(256), 'h'), InvalidKeyError);
    await other.query('ROLLBACK');
  } finally {
    holder.release();
    other.release();
  }
});

test('a request that ran and whose response expired: claim throws KeyGoneError, withIdempotency runs nothing', async () => {
  const key = randomUUID();
  const client = await pool.connect();
  try {
    await client.query('BEGIN');
    await client.query("SELECT set_config('idempotency.ttl', $1, true)", [SHORT_TTL]);
    await claim(client, key, 'h');
    await client.query('INSERT INTO node_jobs VALUES ($1)', [key]);
    await complete(client, key, { done: key });
    await client.query('COMMIT');
    await waitUntilGone(pool, key);

    await client.query('BEGIN');
    const error = await claim(client, key, 'h').catch((e) => e);
    assert.ok(error instanceof KeyGoneError);
    assert.equal(error.status, 410);
    assert.equal(error.code, 'IK410');
    assert.equal(error.cause.code, 'IK410');
    await client.query('ROLLBACK');
    await client.query('BEGIN');
    await assert.rejects(claim(client, key, 'another request'), KeyReusedError);
    await client.query('ROLLBACK');
  } finally {
    client.release();
  }
  let runs = 0;
  await assert.rejects(withIdempotency(pool, { key, requestHash: 'h' }, () => { runs += 1; }), KeyGoneError);
  assert.equal(runs, 0);
  assert.equal(await count(key), 1);
});

test('withIdempotency runs the work once, replays its result, and rolls back a throw', async () => {
  const key = randomUUID();
  let runs = 0;
  const work = async (db) => {
    runs += 1;
    await db.query('INSERT INTO node_jobs VALUES ($1)', [key]);
    return { runs };
  };
  assert.deepEqual(await withIdempotency(pool, { key, requestHash: 'm' }, work), { replayed: false, response: { runs: 1 } });
  assert.deepEqual(await withIdempotency(pool, { key, requestHash: 'm' }, work), { replayed: true, response: { runs: 1 } });
  assert.equal(runs, 1);
  assert.equal(await count(key), 1);

  const failing = randomUUID();
  await assert.rejects(withIdempotency(pool, { key: failing }, async (db) => {
    await db.query('INSERT INTO node_jobs VALUES ($1)', [failing]);
    throw new Error('consumer failed');
  }), /consumer failed/);
  assert.equal(await count(failing), 0);
  const retried = await withIdempotency(pool, { key: failing }, () => 'ok');
  assert.deepEqual(retried, { replayed: false, response: 'ok' });
});

test('withIdempotency seals the handle when the work ends, and works on a connected client', async () => {
  let kept;
  await withIdempotency(pool, { key: randomUUID() }, (db) => { kept = db; return 1; });
  assert.throws(() => kept.query('SELECT 1'), SealedError);

  const client = await pool.connect();
  try {
    const key = randomUUID();
    const result = await withIdempotency(client, { key }, async (db) => {
      assert.throws(() => db.release(), /releases it/);
      return 'on a client';
    });
    assert.deepEqual(result, { replayed: false, response: 'on a client' });
    const { rows: [row] } = await client.query('SELECT now() = statement_timestamp() AS outside');
    assert.equal(row.outside, true, 'the client is outside any transaction again');
  } finally {
    client.release();
  }
});
