'use strict';
// One request, three services: the Node service (idempotency-pg's Express
// wrapper), the Django service (idempotency_pg's decorator) and the Go
// service (packages/go's middleware, goservice/main.go), on the same
// database as the same role. A request first handled by one and retried
// against another with the same key replays the first answer: the
// packages share the fingerprint, the stored document and the key header.
// Runs from a copy of packages/node (packages/run-tests puts it in cross/);
// VENV_PYTHON is a Python with idempotency_pg installed, DJANGO_SITE the
// directory of djsite.py, GO_SERVICE the Go service's program.

const { test, before, after } = require('node:test');
const assert = require('node:assert/strict');
const { spawn } = require('node:child_process');
const { randomUUID } = require('node:crypto');
const readline = require('node:readline');
const express = require('express');
const { idempotent, scopedKey } = require('..');
const { createPool, listen, rawRequest } = require('../test/helpers');

let pool;
let node;
let django;
let djangoPort;
let go;
let goPort;

// Both services scope keys to the API client the X-Client header names.
const byClient = (req) => req.get('X-Client');

function nodeApp() {
  const app = express();
  app.post('/api/orders', express.json(), idempotent({ pool, scope: byClient }, async (req, res) => {
    const { rows: [order] } = await req.db.query(
      'INSERT INTO cross_orders (item, quantity) VALUES ($1, $2) RETURNING id', [req.body.item, req.body.quantity]);
    res.status(201).location(`/api/orders/${order.id}`).json({ order_id: Number(order.id), served_by: 'node' });
  }));
  app.post('/api/binary', express.raw({ type: '*/*' }), idempotent({ pool, scope: byClient }, async (req, res) => {
    await req.db.query("INSERT INTO cross_orders (item, quantity) VALUES ('binary', 1)");
    res.status(200).type('application/octet-stream').send(Buffer.from([0x25, 0x50, 0xff, 0xfe, 0x00, 0x41]));
  }));
  return app;
}

// Starts a service that prints "listening on http://127.0.0.1:PORT".
function startService(name, command, args, options, portOffset) {
  const port = Number(process.env.TEST_PORT_BASE ?? 0) === 0 ? 0 : Number(process.env.TEST_PORT_BASE) + portOffset;
  const child = spawn(command, [...args, String(port)], { ...options, stdio: ['ignore', 'pipe', 'inherit'] });
  return new Promise((resolve, reject) => {
    child.on('error', reject);
    child.on('exit', (code) => reject(new Error(`the ${name} service exited with ${code}`)));
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

function order(port, key, body, client = 'alice') {
  return rawRequest(port, {
    path: '/api/orders',
    headers: [['Content-Type', 'application/json'], ['Idempotency-Key', key], ['X-Client', client]],
    body,
  });
}

before(async () => {
  pool = createPool(4);
  await pool.query(`CREATE TABLE IF NOT EXISTS cross_orders (id bigserial PRIMARY KEY, item text NOT NULL,
    quantity int NOT NULL)`);
  node = await listen(nodeApp());
  ({ child: django, port: djangoPort } = await startService('Django', process.env.VENV_PYTHON, ['djsite.py'],
    { cwd: process.env.DJANGO_SITE }, 50));
  ({ child: go, port: goPort } = await startService('Go', process.env.GO_SERVICE, [], {}, 49));
});

after(async () => {
  for (const child of [django, go]) {
    child?.removeAllListeners('exit');
    child?.kill();
  }
  node?.server.close();
  await pool?.end();
});

// A request handled first by the service on `firstPort` (which answers
// `servedBy`), then retried with its JSON written differently against each of
// `retryPorts`: every retry replays the first answer, status, body and
// headers, and the order was placed once.
async function firstThenRetries({ item, firstPort, servedBy, retryPorts, quantity = 2, retryQuantity = '2' }) {
  const key = randomUUID();
  const first = await order(firstPort, key, `{"item": "${item} ${key}", "quantity": ${quantity}}`);
  assert.equal(first.status, 201);
  assert.equal(first.header('Idempotent-Replayed'), undefined);
  assert.equal(JSON.parse(first.text).served_by, servedBy);
  for (const port of retryPorts) {
    const retry = await order(port, key, `{"quantity": ${retryQuantity}, "item": "${item} ${key}"}`);
    assert.equal(retry.status, 201, `port ${port}`);
    assert.equal(retry.header('Idempotent-Replayed'), 'true');
    assert.deepEqual(retry.body, first.body);
    assert.equal(retry.header('Location'), first.header('Location'));
    assert.ok(retry.rawHeaders.some(([name]) => name === 'Location'));
    assert.equal(retry.header('Content-Type'), first.header('Content-Type'));
  }
  assert.equal(await orders(`${item} ${key}`), 1);
}

test('first handled by Node, retried against Django: replayed, with Node\'s answer', () =>
  firstThenRetries({ item: 'book', firstPort: node.port, servedBy: 'node', retryPorts: [djangoPort] }));

test('first handled by Django, retried against Node: replayed, with Django\'s answer', () =>
  firstThenRetries({ item: 'lamp', firstPort: djangoPort, servedBy: 'django', retryPorts: [node.port],
    quantity: 1, retryQuantity: '1.0' }));

test('another request with the key is 422 on either service', async () => {
  const key = randomUUID();
  const item = `pen ${key}`;
  assert.equal((await order(node.port, key, `{"item": "${item}", "quantity": 1}`)).status, 201);
  const other = await order(djangoPort, key, `{"item": "${item}", "quantity": 3}`);
  assert.equal(other.status, 422);
  assert.equal(other.header('Content-Type'), 'application/problem+json');
  assert.equal(await orders(item), 1);
});

test('one client\'s key stored by Node is not another client\'s on Django, and the reverse', async () => {
  const key = randomUUID();
  const item = `shared key ${key}`;
  assert.equal((await order(node.port, key, `{"item": "${item}", "quantity": 1}`, 'alice')).status, 201);
  const bob = await order(djangoPort, key, `{"item": "${item}", "quantity": 1}`, 'bob');
  assert.equal(bob.status, 201);
  assert.equal(bob.header('Idempotent-Replayed'), undefined);
  assert.equal(JSON.parse(bob.text).served_by, 'django');
  // Another body under Alice's key: Carol's own run, no 422.
  const carol = await order(djangoPort, key, `{"item": "${item}", "quantity": 5}`, 'carol');
  assert.equal(carol.status, 201);
  const bobAgain = await order(node.port, key, `{"item": "${item}", "quantity": 1}`, 'bob');
  assert.equal(bobAgain.header('Idempotent-Replayed'), 'true');
  assert.deepEqual(bobAgain.body, bob.body);
  assert.equal(await orders(item), 3);
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
  const headers = [['Content-Type', 'application/octet-stream'], ['Idempotency-Key', key], ['X-Client', 'alice']];
  const body = Buffer.from([1, 2, 0xff]);
  const first = await rawRequest(node.port, { path: '/api/binary', headers, body });
  assert.deepEqual(first.body, Buffer.from([0x25, 0x50, 0xff, 0xfe, 0x00, 0x41]));
  const retry = await rawRequest(djangoPort, { path: '/api/binary', headers, body });
  assert.equal(retry.status, 200);
  assert.equal(retry.header('Idempotent-Replayed'), 'true');
  assert.deepEqual(retry.body, first.body);
  assert.equal(retry.header('Content-Type'), 'application/octet-stream');
  const { rows: [row] } = await pool.query('SELECT response FROM idempotency.lookup($1)', [scopedKey('alice', key)]);
  assert.equal(row.response.body_encoding, 'base64');
});

test('UTF-8 bytes in the key reach the WSGI service as latin1 and are refused, not mangled', async () => {
  const item = `utf8 ${randomUUID()}`;
  for (const port of [node.port, djangoPort, goPort]) {
    const answer = await order(port, Buffer.from('é'.repeat(50), 'utf8'), `{"item": "${item}", "quantity": 1}`);
    assert.equal(answer.status, 400, `port ${port}`);
    assert.equal(answer.header('Content-Type'), 'application/problem+json');
    assert.match(JSON.parse(answer.text).detail, /non-ASCII/);
  }
  assert.equal(await orders(item), 0);
});

test('first handled by Node, retried against Go: replayed, with Node\'s answer', () =>
  firstThenRetries({ item: 'kettle', firstPort: node.port, servedBy: 'node', retryPorts: [goPort] }));

test('first handled by Go, retried against Node and Django: replayed, with Go\'s answer', () =>
  firstThenRetries({ item: 'chair', firstPort: goPort, servedBy: 'go', retryPorts: [node.port, djangoPort],
    quantity: 1, retryQuantity: '1.0' }));

test('another request with a key stored by Go or by Node is 422 on the other', async () => {
  const key = randomUUID();
  const item = `desk ${key}`;
  assert.equal((await order(goPort, key, `{"item": "${item}", "quantity": 1}`)).status, 201);
  const other = await order(node.port, key, `{"item": "${item}", "quantity": 3}`);
  assert.equal(other.status, 422);
  assert.equal(other.header('Content-Type'), 'application/problem+json');
  const key2 = randomUUID();
  assert.equal((await order(node.port, key2, `{"item": "${item}", "quantity": 1}`)).status, 201);
  const goOther = await order(goPort, key2, `{"item": "${item}", "quantity": 3}`);
  assert.equal(goOther.status, 422);
  assert.deepEqual(JSON.parse(goOther.text), JSON.parse(other.text));
  assert.equal(await orders(item), 2);
});

test('one client\'s key stored by Go is not another client\'s on Node; the quoted key is the bare one', async () => {
  const key = `q-${randomUUID()}`;
  const item = `lamp ${key}`;
  assert.equal((await order(goPort, `"${key}"`, `{"item": "${item}", "quantity": 1}`, 'alice')).status, 201);
  const bob = await order(node.port, key, `{"item": "${item}", "quantity": 1}`, 'bob');
  assert.equal(bob.status, 201);
  assert.equal(bob.header('Idempotent-Replayed'), undefined);
  assert.equal(JSON.parse(bob.text).served_by, 'node');
  const alice = await order(node.port, key, `{"item": "${item}", "quantity": 1}`, 'alice');
  assert.equal(alice.header('Idempotent-Replayed'), 'true');
  const bobOnGo = await order(goPort, `"${key}"`, `{"item": "${item}", "quantity": 1}`, 'bob');
  assert.equal(bobOnGo.header('Idempotent-Replayed'), 'true');
  assert.deepEqual(bobOnGo.body, bob.body);
  assert.equal(await orders(item), 2);
});

test('binary answers replay byte for byte between Go and Node', async () => {
  const body = Buffer.from([1, 2, 0xff]);
  for (const [firstPort, retryPort, bytes] of [[node.port, goPort, [0x25, 0x50, 0xff, 0xfe, 0x00, 0x41]],
    [goPort, node.port, [0x47, 0x4f, 0xff, 0x00, 0xfe]]]) {
    const key = randomUUID();
    const headers = [['Content-Type', 'application/octet-stream'], ['Idempotency-Key', key], ['X-Client', 'alice']];
    const first = await rawRequest(firstPort, { path: '/api/binary', headers, body });
    assert.deepEqual(first.body, Buffer.from(bytes));
    assert.equal(first.header('Idempotent-Replayed'), undefined);
    const retry = await rawRequest(retryPort, { path: '/api/binary', headers, body });
    assert.equal(retry.status, 200);
    assert.equal(retry.header('Idempotent-Replayed'), 'true');
    assert.deepEqual(retry.body, first.body);
    assert.equal(retry.header('Content-Type'), 'application/octet-stream');
    const { rows: [row] } = await pool.query('SELECT response FROM idempotency.lookup($1)', [scopedKey('alice', key)]);
    assert.equal(row.response.body_encoding, 'base64');
  }
});
