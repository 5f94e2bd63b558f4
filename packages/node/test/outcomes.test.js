'use strict';
// The Express wrapper's route options for an application's start and its
// logs: a pool resolved per request, a TTL per route, the events of every
// outcome, a scope that throws, and the problem types' default and override.

const { test, before, after } = require('node:test');
const assert = require('node:assert/strict');
const { randomUUID } = require('node:crypto');
const { spawnSync } = require('node:child_process');
const express = require('express');
const { Pool } = require('pg');
const { idempotent, scopedKey, keyRef, SHARED_KEYS, DEFAULT_PROBLEM_BASE } = require('..');
const { createPool, listen, postJson, gate, shortTtlPool, waitUntilGone } = require('./helpers');

let pool;
let db;
let server;
let port;
const events = [];
const held = new Map(); // text -> gate a handler waits for

function insertNote(req) {
  return req.db.query('INSERT INTO node_outcomes (text) VALUES ($1) RETURNING id', [req.body.text]);
}

async function keyRow(key) {
  const { rows: [row] } = await db.query(
    'SELECT state, extract(epoch FROM expires_at - created_at)::float8 AS ttl FROM idempotency.lookup($1)', [key]);
  return row;
}

async function rows(text) {
  const { rows: [row] } = await db.query('SELECT count(*)::int AS n FROM node_outcomes WHERE text = $1', [text]);
  return row.n;
}

function createApp() {
  const app = express();
  app.set('env', 'test');
  const byClient = (req) => req.get('X-Client');
  const route = (path, options, handler) => app.post(path, express.json(), idempotent(options, handler));
  const note = async (req, res) => {
    const { rows: [row] } = await insertNote(req);
    if (held.has(req.body.text))
      await held.get(req.body.text).promise;
    res.status(req.body.status ?? 201).json({ id: Number(row.id) });
  };

  // The pool is made after the routes, as an application's start does.
  route('/later-pool', { pool: (req) => req.app.locals.pool, scope: byClient }, note);
  route('/no-pool-yet', { pool: (req) => req.app.locals.missing, scope: byClient }, note);
  route('/ttl-days', { pool, scope: byClient, ttl: '3 days' }, note);
  route('/ttl-milliseconds', { pool, scope: byClient, ttl: 90_000 }, note);
  route('/ttl-refused', { pool, scope: byClient, ttl: 'forever' }, note);
  const logged = { pool, scope: byClient, onEvent: (event, req) => events.push({ ...event, url: req.originalUrl }) };
  route('/logged', logged, note);
  route('/logged-throws', logged, async (req) => {
    await insertNote(req);
    throw new Error('declined');
  });
  route('/logged-short', { ...logged, pool: shortTtlPool(pool) }, note);
  route('/logged-large', { ...logged, maxBodyBytes: 10 }, async (req, res) => {
    await insertNote(req);
    res.json({ padding: 'x'.repeat(100) });
  });
  // The README's scope, as written: no user, no principal.
  route('/user-notes', { ...logged, scope: (req) => req.user.id }, note);
  // A scope whose lookup fails: a fault, not an answer about the client.
  route('/lookup-fails', { ...logged, scope: async () => { throw new Error('the user store is down'); } }, note);
  route('/own-problems', { pool, scope: byClient, problemBase: 'https://api.example.com/problems/' }, note);

  app.use((error, req, res, next) => {
    void next;
    res.status(500).json({ error: error.message, name: error.name });
  });
  return app;
}

before(async () => {
  pool = createPool(4);
  db = createPool(2);
  await db.query('CREATE TABLE IF NOT EXISTS node_outcomes (id bigserial PRIMARY KEY, text text NOT NULL)');
  const app = createApp();
  ({ server, port } = await listen(app));
  app.locals.pool = pool;
});

after(async () => {
  server.close();
  await pool.end();
  await db.end();
});

const client = (name) => [['X-Client', name]];

test('pool may be a function of the request: a pool made after the routes serves them', async () => {
  const key = randomUUID();
  const text = `later ${key}`;
  const first = await postJson(port, '/later-pool', key, { text }, client('alice'));
  assert.equal(first.status, 201);
  const retry = await postJson(port, '/later-pool', key, { text }, client('alice'));
  assert.equal(retry.header('Idempotent-Replayed'), 'true');
  assert.equal(await rows(text), 1);
  // A function that finds no pool fails the request clearly, running nothing.
  const missing = await postJson(port, '/no-pool-yet', randomUUID(), { text: `${text} missing` }, client('alice'));
  assert.equal(missing.status, 500);
  assert.match(JSON.parse(missing.text).error, /options\.pool\(req\) returned undefined, not a pg\.Pool/);
  assert.equal(await rows(`${text} missing`), 0);
  for (const bad of [42, {}, 'pool'])
    assert.throws(() => idempotent({ pool: bad, scope: SHARED_KEYS }, () => {}), /options\.pool must be a pg\.Pool/);
});

test('a route\'s ttl is its keys\' TTL, in the request\'s transaction only', async () => {
  const key = randomUUID();
  assert.equal((await postJson(port, '/ttl-days', key, { text: `ttl ${key}` }, client('alice'))).status, 201);
  assert.deepEqual(await keyRow(scopedKey('alice', key)), { state: 'done', ttl: 3 * 86400 });
  const inMs = randomUUID();
  assert.equal((await postJson(port, '/ttl-milliseconds', inMs, { text: `ttl ${inMs}` }, client('alice'))).status, 201);
  assert.deepEqual(await keyRow(scopedKey('alice', inMs)), { state: 'done', ttl: 90 });
  // The next request on the pool's connections gets the database's TTL again.
  const plain = randomUUID();
  assert.equal((await postJson(port, '/later-pool', plain, { text: `ttl ${plain}` }, client('alice'))).status, 201);
  assert.deepEqual(await keyRow(scopedKey('alice', plain)), { state: 'done', ttl: 86400 });
  // The alternative for every route of a pool: the connections' setting.
  const longer = new Pool({ max: 1, options: '-c idempotency.ttl=48h' });
  try {
    const app = express();
    app.post('/longer', express.json(), idempotent({ pool: longer, scope: SHARED_KEYS }, async (req, res) => {
      res.status(201).json({});
    }));
    const { server: longerServer, port: longerPort } = await listen(app);
    const key2 = randomUUID();
    assert.equal((await postJson(longerPort, '/longer', key2, {})).status, 201);
    longerServer.close();
    assert.deepEqual(await keyRow(key2), { state: 'done', ttl: 48 * 3600 });
  } finally {
    await longer.end();
  }
});

test('a ttl is checked: by the route for its type, by the database for its text', async () => {
  for (const bad of [0, -5, 1.5, '', '  ', true, {}])
    assert.throws(() => idempotent({ pool, scope: SHARED_KEYS, ttl: bad }, () => {}), /ttl must be/, String(bad));
  const key = randomUUID();
  const refused = await postJson(port, '/ttl-refused', key, { text: `refused ${key}` }, client('alice'));
  assert.equal(refused.status, 500);
  assert.match(JSON.parse(refused.text).error, /idempotency\.ttl/);
  assert.equal(await rows(`refused ${key}`), 0);
  assert.equal((await keyRow(scopedKey('alice', key))).state, 'absent');
});

function eventsOf(key) {
  return events.filter((event) => event.keyRef === keyRef(key)).map(({ type, status, reason, level }) =>
    ({ type, status, ...(reason === undefined ? {} : { reason }), level }));
}

test('onEvent gets every outcome of a key, with the key hashed and neither key nor body', async () => {
  const key = randomUUID();
  const text = `logged ${key}`;
  const databaseKey = scopedKey('alice', key);
  held.set(text, gate());
  const first = postJson(port, '/logged', key, { text }, client('alice'));
  await waitUntilClaimed(databaseKey);
  assert.equal((await postJson(port, '/logged', key, { text }, client('alice'))).status, 409);
  held.get(text).open();
  assert.equal((await first).status, 201);
  assert.equal((await postJson(port, '/logged', key, { text }, client('alice'))).status, 201);
  assert.equal((await postJson(port, '/logged', key, { text: `${text} other` }, client('alice'))).status, 422);
  assert.deepEqual(eventsOf(databaseKey), [
    { type: 'conflict', status: 409, level: 'info' },
    { type: 'stored', status: 201, level: 'info' },
    { type: 'replayed', status: 201, level: 'info' },
    { type: 'mismatch', status: 422, level: 'warn' },
  ]);
  const one = events.find((event) => event.keyRef === keyRef(databaseKey));
  assert.equal(one.method, 'POST');
  assert.equal(one.path, '/logged');
  assert.match(one.keyRef, /^[0-9a-f]{16}$/);
  const written = JSON.stringify(events);
  assert.ok(!written.includes(key), 'no raw key in the events');
  assert.ok(!written.includes(text), 'no body in the events');
});

async function waitUntilClaimed(key) {
  const deadline = Date.now() + 15000;
  while ((await keyRow(key)).state !== 'in_progress') {
    if (Date.now() > deadline)
      throw new Error(`timed out waiting for ${key} to be claimed`);
    await new Promise((resolve) => setTimeout(resolve, 20));
  }
}

test('onEvent says why a response was not stored', async () => {
  const cases = [
    ['/logged', { status: 503 }, { type: 'not-stored', status: 503, reason: 'server-error', level: 'info' }],
    ['/logged', { status: 429 }, { type: 'not-stored', status: 429, reason: 'not-now', level: 'info' }],
    ['/logged', { status: 422 }, { type: 'not-stored', status: 422, reason: 'validation', level: 'info' }],
    ['/logged-throws', {}, { type: 'not-stored', status: undefined, reason: 'handler-error', level: 'info' }],
    ['/logged-large', {}, { type: 'not-stored', status: 500, reason: 'response-too-large', level: 'warn' }],
  ];
  for (const [path, body, expected] of cases) {
    const key = randomUUID();
    await postJson(port, path, key, { text: `not stored ${key}`, ...body }, client('bob'));
    assert.deepEqual(eventsOf(scopedKey('bob', key)), [expected], `${path} ${JSON.stringify(body)}`);
  }
});

test('onEvent reports a late retry refused with 410', async () => {
  const key = randomUUID();
  const text = `gone ${key}`;
  assert.equal((await postJson(port, '/logged-short', key, { text }, client('carol'))).status, 201);
  await waitUntilGone(db, scopedKey('carol', key));
  assert.equal((await postJson(port, '/logged-short', key, { text }, client('carol'))).status, 410);
  assert.deepEqual(eventsOf(scopedKey('carol', key)), [
    { type: 'stored', status: 201, level: 'info' },
    { type: 'gone', status: 410, level: 'info' },
  ]);
});

test('onEvent reports a 400 for a malformed or missing key, with the reason and no key', async () => {
  const before = events.length;
  const tooLong = 'k'.repeat(256);
  assert.equal((await postJson(port, '/logged', tooLong, { text: 'invalid key' }, client('dave'))).status, 400);
  assert.equal((await postJson(port, '/logged', undefined, { text: 'no key' }, client('dave'))).status, 400);
  const reported = events.slice(before).map(({ type, status, reason, level, keyRef: ref, url }) =>
    ({ type, status, reason, level, ref, url }));
  assert.deepEqual(reported, [
    { type: 'invalid-key', status: 400, reason: 'An Idempotency-Key must be 1 to 255 bytes long.', level: 'info',
      ref: undefined, url: '/logged' },
    { type: 'invalid-key', status: 400, reason: 'no Idempotency-Key header', level: 'info', ref: undefined,
      url: '/logged' },
  ]);
  assert.ok(!JSON.stringify(events.slice(before)).includes(tooLong), 'no raw key in the events');
});

test('a scope that throws a TypeError (req.user.id without a user) is 401 principal-required, reported with its error; '
  + 'other errors are the request\'s', async () => {
  const key = randomUUID();
  const text = `no user ${key}`;
  const answer = await postJson(port, '/user-notes', key, { text });
  assert.equal(answer.status, 401);
  assert.equal(answer.header('Content-Type'), 'application/problem+json');
  assert.equal(JSON.parse(answer.text).type, 'urn:idempotency:problem:principal-required');
  assert.equal(await rows(text), 0);
  const reported = events.filter((event) => event.url === '/user-notes');
  assert.equal(reported.length, 1);
  assert.equal(reported[0].type, 'principal-required');
  assert.equal(reported[0].level, 'warn');
  assert.ok(reported[0].error instanceof TypeError, String(reported[0].error));
  // Any other error is the request's error, for Express's error handlers.
  const failed = await postJson(port, '/lookup-fails', randomUUID(), { text });
  assert.equal(failed.status, 500);
  assert.deepEqual(JSON.parse(failed.text), { error: 'the user store is down', name: 'Error' });
  assert.equal(events.filter((event) => event.url === '/lookup-fails').length, 0);
  assert.equal(await rows(text), 0);
});

test('problem types are urn:idempotency:problem:<name> unless the route sets problemBase', async () => {
  assert.equal(DEFAULT_PROBLEM_BASE, 'urn:idempotency:problem:');
  const missing = await postJson(port, '/later-pool', undefined, { text: 'no key' }, client('alice'));
  assert.equal(JSON.parse(missing.text).type, 'urn:idempotency:problem:missing-idempotency-key');
  const own = await postJson(port, '/own-problems', undefined, { text: 'no key' }, client('alice'));
  assert.equal(JSON.parse(own.text).type, 'https://api.example.com/problems/missing-idempotency-key');
});

test('options given as undefined take their defaults; a hook that is not a function is refused', () => {
  assert.doesNotThrow(() => idempotent({ pool, scope: SHARED_KEYS, onEvent: undefined, problemBase: undefined }, () => {}));
  assert.throws(() => idempotent({ pool, scope: SHARED_KEYS, onEvent: 'console' }, () => {}), /options\.onEvent/);
});

test('the default onEvent writes to stderr only under NODE_DEBUG=idempotency-pg', () => {
  const script = `
    const { DEFAULTS } = require('./lib/express');
    const { outcomeEvent } = require('./lib/events');
    DEFAULTS.onEvent(outcomeEvent({ method: 'POST', originalUrl: '/charges?token=secret' }, 'replayed',
      { databaseKey: 'k', status: 201 }));`;
  const run = (env) => spawnSync(process.execPath, ['-e', script], { cwd: `${__dirname}/..`, env, encoding: 'utf8' });
  const debugging = run({ ...process.env, NODE_DEBUG: 'idempotency-pg' });
  assert.equal(debugging.status, 0, debugging.stderr);
  assert.match(debugging.stderr, /IDEMPOTENCY-PG \d+: replayed POST \/charges key=[0-9a-f]{16} status=201/);
  assert.ok(!debugging.stderr.includes('secret'));
  const quiet = run({ ...process.env, NODE_DEBUG: '' });
  assert.equal(quiet.stderr, '');
});
