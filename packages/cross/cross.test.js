'use strict';
// One request, two services: the Node service (idempotency-pg's Express
// wrapper) and the Django service (idempotency_pg's decorator), on the same
// database as the same role. A request first handled by one and retried
// against the other with the same key replays the first answer: the two
// packages share the fingerprint, the stored document and the key header.
// Runs from a copy of packages/node (packages/run-tests puts it in cross/);
// VENV_PYTHON is a Python with idempotency_pg installed, DJANGO_SITE the
// directory of djsite.py.

const { test, before, after } = require('node:test');
const assert = require('node:assert/strict');
const { spawn } = require('node:child_process');
const { randomUUID } = require('node:crypto');
const readline = require('node:readline');
const express = require('express');
const { idempotent } = require('..');
const { createPool, listen, rawRequest } = require('../test/helpers');

let pool;
let node;
let django;
let djangoPort;

function nodeApp() {
  const app = express();
  app.post('/api/orders', express.json(), idempotent({ pool }, async (req, res) => {
    const { rows: [order] } = await req.db.query(
      'INSERT INTO cross_orders (item, quantity) VALUES ($1, $2) RETURNING id', [req.body.item, req.body.quantity]);
    res.status(201).location(`/api/orders/${order.id}`).json({ order_id: Number(order.id), served_by: 'node' });
  }));
  app.post('/api/binary', express.raw({ type: '*/*' }), idempotent({ pool }, async (req, res) => {
    await req.db.query("INSERT INTO cross_orders (item, quantity) VALUES ('binary', 1)");
    res.status(200).type('application/octet-stream').send(Buffer.from([0x25, 0x50, 0xff, 0xfe, 0x00, 0x41]));
  }));
  return app;
}

function startDjango() {
  const port = Number(process.env.TEST_PORT_BASE ?? 0) === 0 ? 0 : Number(process.env.TEST_PORT_BASE) + 50;
  const child = spawn(process.env.VENV_PYTHON, ['djsite.py', String(port)], {
    cwd: process.env.DJANGO_SITE, stdio: ['ignore', 'pipe', 'inherit'],
  });
  return new Promise((resolve, reject) => {
    child.on('exit', (code) => reject(new Error(`the Django service exited with ${code}`)));
    readline.createInterface({ input: child.stdout }).on('line', (line) => {
      const match = /listening on http:\/\/127\.0\.0\.1:(\d+)/.exec(line);
      if (match)
        resolve({ child, port: Number(match[1]) });
    });
  });
}

async function orders(item) {
  const { rows: [row] } = await pool.query('SELECT count(*)::int AS n FROM cross_orders WHERE item = $1', [item]);
  return row.n;
}

function order(port, key, body) {
  return rawRequest(port, {
    path: '/api/orders', headers: [['Content-Type', 'application/json'], ['Idempotency-Key', key]], body,
  });
}

before(async () => {
  pool = createPool(4);
  await pool.query(`CREATE TABLE IF NOT EXISTS cross_orders (id bigserial PRIMARY KEY, item text NOT NULL,
    quantity int NOT NULL)`);
  node = await listen(nodeApp());
  ({ child: django, port: djangoPort } = await startDjango());
});

after(async () => {
  django?.removeAllListeners('exit');
  django?.kill();
  node?.server.close();
  await pool?.end();
});

test('first handled by Node, retried against Django: replayed, with Node\'s answer', async () => {
  const key = randomUUID();
  const item = `book ${key}`;
  const first = await order(node.port, key, `{"item": "${item}", "quantity": 2}`);
  assert.equal(first.status, 201);
  assert.equal(JSON.parse(first.text).served_by, 'node');
  // The same request, its JSON written differently.
  const retry = await order(djangoPort, key, `{"quantity":2,"item":"${item}"}`);
  assert.equal(retry.status, 201);
  assert.equal(retry.header('Idempotent-Replayed'), 'true');
  assert.deepEqual(retry.body, first.body);
  assert.equal(retry.header('Location'), first.header('Location'));
  assert.ok(retry.rawHeaders.some(([name]) => name === 'Location'));
  assert.equal(retry.header('Content-Type'), first.header('Content-Type'));
  assert.equal(await orders(item), 1);
});

test('first handled by Django, retried against Node: replayed, with Django\'s answer', async () => {
  const key = randomUUID();
  const item = `lamp ${key}`;
  const first = await order(djangoPort, key, `{"item": "${item}", "quantity": 1}`);
  assert.equal(first.status, 201);
  assert.equal(JSON.parse(first.text).served_by, 'django');
  const retry = await order(node.port, key, `{"quantity": 1.0, "item": "${item}"}`);
  assert.equal(retry.status, 201);
  assert.equal(retry.header('Idempotent-Replayed'), 'true');
  assert.deepEqual(retry.body, first.body);
  assert.equal(retry.header('Location'), first.header('Location'));
  assert.equal(await orders(item), 1);
});

test('another request with the key is 422 on either service', async () => {
  const key = randomUUID();
  const item = `pen ${key}`;
  assert.equal((await order(node.port, key, `{"item": "${item}", "quantity": 1}`)).status, 201);
  const other = await order(djangoPort, key, `{"item": "${item}", "quantity": 3}`);
  assert.equal(other.status, 422);
  assert.equal(other.header('Content-Type'), 'application/problem+json');
  assert.equal(await orders(item), 1);
});

test('the quoted key on one service is the bare key on the other', async () => {
  const key = `q-${randomUUID()}`;
  const item = `cup ${key}`;
  assert.equal((await order(node.port, `"${key}"`, `{"item": "${item}", "quantity": 1}`)).status, 201);
  const retry = await order(djangoPort, key, `{"item": "${item}", "quantity": 1}`);
  assert.equal(retry.header('Idempotent-Replayed'), 'true');
});

test('a binary answer stored by Node replays byte for byte from Django', async () => {
  const key = randomUUID();
  const headers = [['Content-Type', 'application/octet-stream'], ['Idempotency-Key', key]];
  const body = Buffer.from([1, 2, 0xff]);
  const first = await rawRequest(node.port, { path: '/api/binary', headers, body });
  assert.deepEqual(first.body, Buffer.from([0x25, 0x50, 0xff, 0xfe, 0x00, 0x41]));
  const retry = await rawRequest(djangoPort, { path: '/api/binary', headers, body });
  assert.equal(retry.status, 200);
  assert.equal(retry.header('Idempotent-Replayed'), 'true');
  assert.deepEqual(retry.body, first.body);
  assert.equal(retry.header('Content-Type'), 'application/octet-stream');
  const { rows: [row] } = await pool.query('SELECT response FROM idempotency.lookup($1)', [key]);
  assert.equal(row.response.body_encoding, 'base64');
});

test('UTF-8 bytes in the key reach the WSGI service as latin1 and are refused, not mangled', async () => {
  const item = `utf8 ${randomUUID()}`;
  for (const port of [node.port, djangoPort]) {
    const answer = await order(port, Buffer.from('é'.repeat(50), 'utf8'), `{"item": "${item}", "quantity": 1}`);
    assert.equal(answer.status, 400, `port ${port}`);
    assert.equal(answer.header('Content-Type'), 'application/problem+json');
    assert.match(JSON.parse(answer.text).detail, /non-ASCII/);
  }
  assert.equal(await orders(item), 0);
});
