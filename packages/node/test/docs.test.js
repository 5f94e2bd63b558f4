'use strict';
// The JavaScript snippets of README.md and of docs/frameworks.md's Node
// section, run as written. Each snippet follows a line
// <!-- snippet: NAME --> naming the harness below that runs it: the harness
// gives the snippet what the surrounding application would have (an
// Express app with authentication, a pool, a table) and checks what it
// does. A JavaScript snippet without a marker fails the test.
//
// The repository's docs are found from SHARED_DIR (packages/run-tests
// names packages/shared), else from this checkout.

const { test, before, after } = require('node:test');
const assert = require('node:assert/strict');
const fs = require('node:fs');
const path = require('node:path');
const { randomUUID } = require('node:crypto');
const { once } = require('node:events');
const express = require('express');
const pg = require('pg');
const { createPool, listen, postJson, rawRequest, waitFor } = require('./helpers');

const packageDir = path.join(__dirname, '..');
const repo = process.env.SHARED_DIR ? path.resolve(process.env.SHARED_DIR, '..', '..') : path.join(packageDir, '..', '..');

// [{ name, code, where }] of the ```js fences of a Markdown text.
function snippets(markdown, where) {
  const found = [];
  const lines = markdown.split('\n');
  for (let i = 0; i < lines.length; i++) {
    if (lines[i] !== '```js')
      continue;
    const marker = /^<!-- snippet: ([a-z-]+) -->$/.exec(lines[i - 1] ?? '');
    const end = lines.indexOf('```', i + 1);
    assert.ok(marker, `${where}:${i + 1}: a JavaScript snippet without a <!-- snippet: NAME --> line before it`);
    found.push({ name: marker[1], code: lines.slice(i + 1, end).join('\n'), where: `${where}:${i + 1}` });
    i = end;
  }
  return found;
}

// The section of a Markdown text from its heading to the next of its level.
function section(markdown, heading) {
  const start = markdown.indexOf(`\n${heading}\n`);
  assert.notEqual(start, -1, `no section ${heading}`);
  const next = markdown.indexOf('\n## ', start + heading.length + 2);
  return markdown.slice(start, next === -1 ? undefined : next);
}

const AsyncFunction = (async () => {}).constructor;
// Runs a snippet as the body of an async function of the given names.
function run(code, names) {
  return new AsyncFunction(...Object.keys(names), code)(...Object.values(names));
}

// An authentication middleware: Authorization: Bearer <user> sets req.user.
function authenticate(req, res, next) {
  const bearer = /^Bearer (.+)$/.exec(req.get('Authorization') ?? '');
  if (bearer)
    req.user = { id: bearer[1] };
  next();
}

let pool;
const closers = [];

before(async () => {
  pool = createPool(4);
  await pool.query(`
    CREATE TABLE IF NOT EXISTS charges (id bigserial PRIMARY KEY, amount int NOT NULL);
    CREATE TABLE IF NOT EXISTS refunds (id bigserial PRIMARY KEY, charge_id int NOT NULL);
    CREATE TABLE IF NOT EXISTS stock (sku text PRIMARY KEY, quantity int NOT NULL);
    CREATE TABLE IF NOT EXISTS transfers (message_id text NOT NULL, account text NOT NULL, amount int NOT NULL);
    CREATE OR REPLACE FUNCTION apply_transfer(message_id text, account text, amount int) RETURNS jsonb
      LANGUAGE sql AS $$
        INSERT INTO transfers VALUES (message_id, account, amount);
        SELECT jsonb_build_object('account', account, 'amount', amount)
      $$;`);
});

after(async () => {
  for (const close of closers.reverse())
    await close();
  await pool.end();
});

async function keyRow(key) {
  const { rows: [row] } = await pool.query(`SELECT state, response,
    extract(epoch FROM expires_at - created_at)::float8 AS ttl FROM idempotency.lookup($1)`, [key]);
  return row;
}

const bearer = (user) => [['Authorization', `Bearer ${user}`]];

const harnesses = {
  // A route of an application whose authentication sets req.user.
  async 'express-route'(code) {
    const app = express();
    app.use(authenticate);
    await run(code, { app, express, pool, require });
    const { server, port } = await listen(app);
    closers.push(() => server.close());
    const key = randomUUID();
    const first = await postJson(port, '/charges', key, { amount: 1250 }, bearer('alice'));
    assert.equal(first.status, 201, first.text);
    assert.equal(JSON.parse(first.text).amount, 1250);
    assert.match(first.header('Location'), /^\/charges\/\d+$/);
    const retry = await postJson(port, '/charges', key, { amount: 1250 }, bearer('alice'));
    assert.equal(retry.header('Idempotent-Replayed'), 'true');
    assert.deepEqual(retry.body, first.body);
    // No user: req.user.id throws, and the answer is the documented 401.
    const anonymous = await postJson(port, '/charges', randomUUID(), { amount: 1 });
    assert.equal(anonymous.status, 401);
    assert.equal(JSON.parse(anonymous.text).type, 'urn:idempotency:problem:principal-required');
  },

  // A whole application: its pool made at start, after the routes.
  // app.listen(3000) listens on a free port instead.
  async startup(code) {
    let app;
    const started = [];
    const patchedExpress = Object.assign((...args) => {
      app = express(...args);
      app.listen = (...ignored) => {
        const server = require('node:http').createServer(app).listen(0, '127.0.0.1');
        started.push(once(server, 'listening').then(() => server));
        closers.push(() => server.close());
        return server;
      };
      return app;
    }, express);
    const logged = [];
    const logger = {
      info: (event, message) => logged.push(['info', event.type, message]),
      warn: (event, message) => logged.push(['warn', event.type, message]),
    };
    const snippetRequire = (name) => (name === 'express' ? patchedExpress : require(name));
    await run(code, { require: snippetRequire, authenticate, logger });
    await waitFor(() => started.length === 1 && app.locals.pool, 'the application to start');
    closers.push(() => app.locals.pool.end());
    const server = await started[0];
    const { port } = server.address();
    const key = randomUUID();
    const first = await postJson(port, '/refunds', key, { chargeId: 7 }, bearer('bob'));
    assert.equal(first.status, 201, first.text);
    const retry = await postJson(port, '/refunds', key, { chargeId: 7 }, bearer('bob'));
    assert.equal(retry.header('Idempotent-Replayed'), 'true');
    const { scopedKey } = require('idempotency-pg');
    const row = await keyRow(scopedKey('bob', key));
    assert.equal(row.ttl, 7 * 86400, 'the route\'s ttl');
    assert.deepEqual(logged, [
      ['info', 'stored', 'idempotency: stored'], ['info', 'replayed', 'idempotency: replayed'],
    ]);
    assert.equal((await rawRequest(port, { path: '/refunds', headers: [['Idempotency-Key', randomUUID()]] })).status,
      401);
    // scope threw: a warning, with the error.
    assert.deepEqual(logged.at(-1), ['warn', 'principal-required', 'idempotency: principal-required']);
  },

  // Handler code in the caller's transaction.
  async claim(code) {
    const client = await pool.connect();
    const key = randomUUID();
    try {
      await run(code, { client, key, requestHash: 'a-request-hash', require });
      await run(code, { client, key, requestHash: 'a-request-hash', require }); // a retry replays
    } finally {
      client.release();
    }
    const row = await keyRow(key);
    assert.equal(row.state, 'done');
    assert.deepEqual(row.response, { order: 1234 });
    assert.equal(row.ttl, 3600);
  },

  // A job applied once per message.
  async 'with-idempotency'(code) {
    const message = { id: randomUUID(), sku: `widget-${randomUUID()}` };
    await pool.query('INSERT INTO stock VALUES ($1, 5)', [message.sku]);
    await run(code, { pool, message, require });
    await run(code, { pool, message, require }); // a redelivery
    const { rows: [stock] } = await pool.query('SELECT quantity FROM stock WHERE sku = $1', [message.sku]);
    assert.equal(stock.quantity, 4);
    assert.deepEqual((await keyRow(message.id)).response, { shipped: true });
  },

  // A consumer on an amqplib connection: a stand-in channel records acks.
  async consume(code) {
    const acked = [];
    let onMessage;
    const channel = {
      prefetch: async () => {},
      consume: async (queue, handler) => { onMessage = handler; return { consumerTag: 'docs' }; },
      cancel: async () => {},
      ack: (message) => acked.push(message.properties.messageId),
      nack: () => assert.fail('nacked'),
      publish: () => true,
      sendToQueue: () => true,
      waitForConfirms: async () => {},
    };
    const connection = { createConfirmChannel: async () => channel };
    await run(code, { connection, pool, require });
    const id = randomUUID();
    const delivery = (redelivered) => ({
      content: Buffer.from(JSON.stringify({ account: `acct-${id}`, amount: 30 })),
      fields: { deliveryTag: acked.length + 1, redelivered },
      properties: { messageId: id, headers: {} },
    });
    onMessage(delivery(false));
    await waitFor(() => acked.length === 1, 'the message to be acked');
    onMessage(delivery(true));
    await waitFor(() => acked.length === 2, 'the redelivery to be acked');
    const { rows: [row] } = await pool.query('SELECT count(*)::int AS n FROM transfers WHERE message_id = $1', [id]);
    assert.equal(row.n, 1, 'applied once');
    assert.deepEqual((await keyRow(id)).response, { account: `acct-${id}`, amount: 30 });
  },
};

const readme = fs.readFileSync(path.join(packageDir, 'README.md'), 'utf8');
const frameworks = fs.readFileSync(path.join(repo, 'docs', 'frameworks.md'), 'utf8');
const documented = [
  ...snippets(readme, 'packages/node/README.md'),
  ...snippets(section(frameworks, '## Node.js: `idempotency-pg` (Express, node-postgres)'), 'docs/frameworks.md (Node)'),
];

test('every snippet names a harness, and every harness runs a snippet', () => {
  for (const { name, where } of documented)
    assert.ok(harnesses[name], `${where}: no harness ${name}`);
  assert.deepEqual([...new Set(documented.map(({ name }) => name))].sort(), Object.keys(harnesses).sort());
});

for (const { name, code, where } of documented) {
  test(`the snippet at ${where} runs as written (${name})`, () => harnesses[name](code));
}
