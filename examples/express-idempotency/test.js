'use strict';
// End-to-end tests of idempotency-pg's route wrapper through the checkout
// service's POST /api/charges: real HTTP requests against the app on
// 127.0.0.1, and the database's charges and keys checked after each.
// Needs PGHOST/PGPORT/PGDATABASE/PGUSER of a database where schema.sql is
// loaded and the idempotency extension is created.

const { test, before, after } = require('node:test');
const assert = require('node:assert/strict');
const { once } = require('node:events');
const { randomUUID } = require('node:crypto');
const express = require('express');
const { Client, Pool } = require('pg');
const { createApp, DECLINED_CARD } = require('./app');
const { idempotent, SHARED_KEYS } = require('idempotency-pg');

const CARD = '4242424242424242';
const PROBLEM_BASE = 'urn:idempotency:problem:';

let pool;
let server;
let baseUrl;
let db;
let notesServer;
let notesUrl;
let failNextNote = false;

// A bare route besides the checkout app's: it writes a note, then fails
// when the test asks it to; key-less requests are allowed.
function createNotesApp() {
  const app = express();
  app.post('/notes', express.json(), idempotent({ pool, scope: SHARED_KEYS, required: false }, async (req, res) => {
    const { rows: [note] } = await req.db.query(
      'INSERT INTO notes (text) VALUES ($1) RETURNING id', [req.body.text]);
    if (failNextNote) {
      failNextNote = false;
      throw new Error('the route failed after writing');
    }
    res.status(201).json({ note_id: note.id });
  }));
  app.use((error, req, res, next) => res.status(500).json({ title: error.message }));
  return app;
}

async function postNote(key, text) {
  const headers = { 'Content-Type': 'application/json' };
  if (key !== undefined)
    headers['Idempotency-Key'] = key;
  const response = await fetch(`${notesUrl}/notes`, {
    method: 'POST', headers, body: JSON.stringify({ text }),
  });
  return { status: response.status, headers: response.headers, text: await response.text() };
}

async function notesWith(text) {
  const { rows: [row] } = await db.query('SELECT count(*) AS notes FROM notes WHERE text = $1', [text]);
  return Number(row.notes);
}

async function post(key, body) {
  const headers = { 'Content-Type': 'application/json' };
  if (key !== undefined)
    headers['Idempotency-Key'] = key;
  const response = await fetch(`${baseUrl}/api/charges`, {
    method: 'POST', headers, body: JSON.stringify(body),
  });
  const text = await response.text();
  return { status: response.status, headers: response.headers, text, body: JSON.parse(text) };
}

async function createOrder(amountCents) {
  const { rows: [order] } = await db.query(
    `INSERT INTO orders (id, description, amount_cents)
     SELECT coalesce(max(id), 0) + 1, 'Test order', $1 FROM orders RETURNING id`, [amountCents]);
  return Number(order.id);
}

async function chargesOf(orderId) {
  const { rows } = await db.query(
    'SELECT id, status FROM charges WHERE order_id = $1 ORDER BY id', [orderId]);
  return rows.map((row) => ({ id: Number(row.id), status: row.status }));
}

async function setCardNetwork(available) {
  await db.query('UPDATE card_network SET available = $1', [available]);
}

async function waitFor(condition, what) {
  const deadline = Date.now() + 10000;
  while (!(await condition())) {
    if (Date.now() > deadline)
      throw new Error(`timed out waiting for ${what}`);
    await new Promise((resolve) => setTimeout(resolve, 20));
  }
}

// True when a session of this database waits for a row lock, as a charge
// does while another transaction holds its order.
async function someoneWaitsForALock() {
  const { rows: [row] } = await db.query(
    `SELECT count(*) AS waiting FROM pg_stat_activity
      WHERE datname = current_database() AND wait_event_type = 'Lock'`);
  return Number(row.waiting) > 0;
}

function assertProblem(response, status, type) {
  assert.equal(response.status, status);
  assert.equal(response.headers.get('content-type'), 'application/problem+json');
  assert.equal(response.body.type, PROBLEM_BASE + type);
  assert.equal(response.body.status, status);
}

before(async () => {
  db = new Client();
  await db.connect();
  pool = new Pool({ max: 5 });
  server = createApp(pool).listen(0, '127.0.0.1');
  await once(server, 'listening');
  baseUrl = `http://127.0.0.1:${server.address().port}`;
  await db.query('CREATE TABLE IF NOT EXISTS notes (id serial PRIMARY KEY, text text NOT NULL)');
  notesServer = createNotesApp().listen(0, '127.0.0.1');
  await once(notesServer, 'listening');
  notesUrl = `http://127.0.0.1:${notesServer.address().port}`;
});

after(async () => {
  notesServer.close();
  server.close();
  await pool.end();
  await db.end();
});

test('a first request runs the route and commits its charge', async () => {
  const order = await createOrder(1250);
  const response = await post(randomUUID(), { order_id: order, card: CARD });

  assert.equal(response.status, 201);
  assert.equal(response.headers.get('idempotent-replayed'), null);
  const charges = await chargesOf(order);
  assert.deepEqual(charges.map((charge) => charge.status), ['succeeded']);
  assert.equal(response.body.charge_id, charges[0].id);
  assert.equal(response.headers.get('location'), `/api/charges/${charges[0].id}`);
});

test('a retry replays status, stored headers and body with Idempotent-Replayed: true', async () => {
  const order = await createOrder(1250);
  const key = randomUUID();
  const first = await post(key, { order_id: order, card: CARD });
  // Field order is not part of the request: the body hashes in canonical form.
  const retry = await post(key, { card: CARD, order_id: order });

  assert.equal(first.status, 201);
  assert.equal(retry.status, 201);
  assert.equal(retry.headers.get('idempotent-replayed'), 'true');
  assert.equal(retry.text, first.text);
  assert.equal(retry.headers.get('content-type'), first.headers.get('content-type'));
  assert.equal(retry.headers.get('location'), first.headers.get('location'));
  assert.equal(retry.headers.get('etag'), first.headers.get('etag'));
  assert.equal((await chargesOf(order)).length, 1);

  // What is stored: the status, the replayable headers as the app named
  // them, and the body as text.
  const { rows: [stored] } = await db.query(
    'SELECT response FROM idempotency.lookup($1)', [key]);
  assert.deepEqual(stored.response, {
    status: 201,
    headers: {
      'Content-Type': 'application/json; charset=utf-8',
      Location: `/api/charges/${first.body.charge_id}`,
      ETag: first.headers.get('etag'), // Express's own
    },
    body: first.text,
  });
});

test('a concurrent duplicate gets 409 with Retry-After while the first is in flight', async () => {
  const order = await createOrder(1250);
  const key = randomUUID();
  const body = { order_id: order, card: CARD };
  // Holding the order's row lock keeps the first request inside its route,
  // after it claimed the key.
  const holder = new Client();
  await holder.connect();
  let first;
  try {
    await holder.query('BEGIN');
    await holder.query('SELECT FROM orders WHERE id = $1 FOR UPDATE', [order]);
    first = post(key, body);
    await waitFor(someoneWaitsForALock, 'the first request to wait for the order');

    const duplicate = await post(key, body);
    assertProblem(duplicate, 409, 'request-in-progress');
    assert.equal(duplicate.headers.get('retry-after'), '1');
  } finally {
    await holder.query('COMMIT');
    await holder.end();
  }
  const firstResponse = await first;
  assert.equal(firstResponse.status, 201);
  const retry = await post(key, body);
  assert.equal(retry.headers.get('idempotent-replayed'), 'true');
  assert.equal(retry.text, firstResponse.text);
  assert.equal((await chargesOf(order)).length, 1);
});

test('the same key with a changed body is 422 problem details and runs nothing', async () => {
  const order = await createOrder(1250);
  const key = randomUUID();
  assert.equal((await post(key, { order_id: order, card: CARD })).status, 201);

  const changed = await post(key, { order_id: order, card: '5555555555554444' });
  assertProblem(changed, 422, 'idempotency-key-reused');
  assert.equal((await chargesOf(order)).length, 1);
});

test('a 4xx answer is stored with its effects and replayed', async () => {
  const order = await createOrder(1250);
  const key = randomUUID();
  const declined = await post(key, { order_id: order, card: DECLINED_CARD });
  assert.equal(declined.status, 402);
  assert.equal(declined.body.status, 'declined');

  const retry = await post(key, { order_id: order, card: DECLINED_CARD });
  assert.equal(retry.status, 402);
  assert.equal(retry.headers.get('idempotent-replayed'), 'true');
  assert.equal(retry.text, declined.text);
  assert.deepEqual((await chargesOf(order)).map((charge) => charge.status), ['declined']);
});

test('a 5xx answer is not stored: its transaction rolls back and the retry runs again', async () => {
  const order = await createOrder(1250);
  const key = randomUUID();
  await setCardNetwork(false);
  let failed;
  try {
    failed = await post(key, { order_id: order, card: CARD });
  } finally {
    await setCardNetwork(true);
  }
  assert.equal(failed.status, 503);
  assert.equal(failed.headers.get('retry-after'), '1');
  assert.deepEqual(await chargesOf(order), []); // the route's INSERT rolled back

  const retry = await post(key, { order_id: order, card: CARD });
  assert.equal(retry.status, 201);
  assert.equal(retry.headers.get('idempotent-replayed'), null);
  assert.deepEqual((await chargesOf(order)).map((charge) => charge.status), ['succeeded']);
});

test('a missing or invalid Idempotency-Key is 400 and runs nothing', async () => {
  const order = await createOrder(1250);
  assertProblem(await post(undefined, { order_id: order, card: CARD }), 400, 'missing-idempotency-key');
  assertProblem(await post('', { order_id: order, card: CARD }), 400, 'invalid-idempotency-key');
  assertProblem(await post('k'.repeat(256), { order_id: order, card: CARD }), 400, 'invalid-idempotency-key');
  assert.deepEqual(await chargesOf(order), []);

  const longestKey = randomUUID().padEnd(255, 'k');
  assert.equal((await post(longestKey, { order_id: order, card: CARD })).status, 201);
});

test('an error thrown by the route rolls back, is not stored, and the retry runs again', async () => {
  const key = randomUUID();
  const text = `thrown ${key}`;
  failNextNote = true;
  const failed = await postNote(key, text);
  assert.equal(failed.status, 500);
  assert.equal(await notesWith(text), 0);

  const retry = await postNote(key, text);
  assert.equal(retry.status, 201);
  assert.equal(retry.headers.get('idempotent-replayed'), null);
  assert.equal(await notesWith(text), 1);
});

test('with required: false a request without a key runs, commits, and is never replayed', async () => {
  const text = `keyless ${randomUUID()}`;
  const first = await postNote(undefined, text);
  const second = await postNote(undefined, text);

  for (const response of [first, second]) {
    assert.equal(response.status, 201);
    assert.equal(response.headers.get('idempotent-replayed'), null);
  }
  assert.notEqual(first.text, second.text);
  assert.equal(await notesWith(text), 2);
});
