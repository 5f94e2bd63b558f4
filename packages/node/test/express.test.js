'use strict';
// The Express route wrapper against a real database: every rule of the
// README, and each bug of the copied adapter it replaces as a regression
// test.

const { test, before, after } = require('node:test');
const assert = require('node:assert/strict');
const { randomUUID } = require('node:crypto');
const { Readable } = require('node:stream');
const express = require('express');
const { idempotent, SealedError, SHARED_KEYS, scopedKey } = require('..');
const { createPool, listen, rawRequest, postJson, waitFor, gate, shortTtlPool, waitUntilGone } = require('./helpers');

let pool;
let db;
let server;
let port;
let lateErrors = [];
const held = new Map(); // text -> gate a handler waits for

async function rows(text) {
  const { rows: [row] } = await db.query('SELECT count(*)::int AS n FROM node_notes WHERE text = $1', [text]);
  return row.n;
}

async function storedResponse(key) {
  const { rows: [row] } = await db.query('SELECT response FROM idempotency.lookup($1)', [key]);
  return row.response;
}

async function keyState(key) {
  const { rows: [row] } = await db.query('SELECT state FROM idempotency.lookup($1)', [key]);
  return row.state;
}

function insertNote(req) {
  return req.db.query('INSERT INTO node_notes (text) VALUES ($1) RETURNING id', [req.body.text]);
}

function createApp() {
  const app = express();
  app.set('env', 'test'); // Express's error page without a stack trace on stderr
  const options = { pool, scope: SHARED_KEYS, onLateError: (error) => lateErrors.push(error) };
  const route = (path, handler, extra = {}) =>
    app.post(path, express.json(), idempotent({ ...options, ...extra }, handler));

  route('/notes', async (req, res) => {
    const { rows: [note] } = await insertNote(req);
    if (held.has(req.body.text))
      await held.get(req.body.text).promise;
    res.status(201).location(`/notes/${note.id}`).set('ETag', `"note-${note.id}"`)
      .json({ id: Number(note.id), text: req.body.text });
  });
  route('/notes-waiting', async (req, res) => {
    await insertNote(req);
    res.status(201).json({ text: req.body.text });
  }, { waitTimeout: '10s' });
  // Throws after writing, with the status its error carries.
  route('/throws', async (req, res) => {
    await insertNote(req);
    const error = new Error('insufficient funds');
    error.status = req.body.status;
    throw error;
  });
  route('/next-error', async (req, res, next) => {
    await insertNote(req);
    const error = new Error('declined');
    error.status = 402;
    next(error);
  });
  route('/status', async (req, res) => {
    await insertNote(req);
    res.status(req.body.status).json({ status: req.body.status });
  });
  route('/status-validation-stored', async (req, res) => {
    await insertNote(req);
    res.status(req.body.status).json({ status: req.body.status });
  }, { storeValidationErrors: true });
  // Answers, then keeps using the transaction.
  route('/audit-after-answer', async (req, res) => {
    await insertNote(req);
    res.status(201).json({ ok: true });
    await req.db.query("INSERT INTO node_notes (text) VALUES ('audit ' || $1)", [req.body.text]);
  });
  route('/audit-in-callback', (req, res) => {
    insertNote(req).then(() => {
      res.status(201).json({ ok: true });
      setImmediate(() => {
        try {
          req.db.query('SELECT 1');
          held.get('callback-result').open('no error');
        } catch (error) {
          held.get('callback-result').open(error);
        }
      });
    });
  });
  // Bodies of every kind, given base64 in the request.
  route('/body', async (req, res) => {
    await insertNote(req);
    res.status(200).type(req.body.type).send(Buffer.from(req.body.base64, 'base64'));
  });
  route('/text', async (req, res) => {
    await insertNote(req);
    res.type('text/plain; charset=utf-8').send(`héllo ${req.body.text} ✓`);
  });
  route('/stream', async (req, res) => {
    await insertNote(req);
    res.status(200).set('Content-Type', 'text/csv');
    const lines = Array.from({ length: req.body.lines }, (_, i) => `${i},${'x'.repeat(100)}\n`);
    await new Promise((resolve, reject) => {
      Readable.from(lines).pipe(res).on('finish', resolve).on('error', reject);
      res.on('finish', resolve);
      // the wrapper holds the stream back: end() is where it is settled
      const end = res.end;
      res.end = function (...args) {
        const result = end.apply(this, args);
        resolve();
        return result;
      };
    });
  }, { maxBodyBytes: 64 * 1024 });
  route('/write-head', async (req, res) => {
    await insertNote(req);
    res.writeHead(202, { 'Content-Type': 'application/json', 'X-Other': 'not replayed', ETag: 'W/"7"' });
    res.end('{"accepted":true}');
  });
  // The handler's own SQL fails with SQLSTATEs the claim uses.
  route('/handler-sql-error', async (req, res) => {
    await req.db.query(`DO $$ BEGIN RAISE EXCEPTION 'the handler''s own error' USING ERRCODE = '${req.body.code}'; END $$`);
    res.json({});
  });
  // Earlier middleware's headers stay; the failed handler's do not leak.
  app.post('/cors-throws', (req, res, next) => { res.set('Access-Control-Allow-Origin', '*'); next(); },
    express.json(), idempotent(options, async (req, res) => {
      await insertNote(req);
      res.location('/leaked');
      throw new Error('failed after setting Location');
    }));
  app.post('/optional', express.json(), idempotent({ ...options, required: false }, async (req, res) => {
    await insertNote(req);
    res.status(201).json({ key: req.idempotency.key ?? null });
  }));
  // Keys scoped to the API client that X-Client names (what an
  // authentication middleware would set as req.user).
  route('/client-notes', async (req, res) => {
    const { rows: [note] } = await insertNote(req);
    res.status(201).json({ id: Number(note.id), text: req.body.text, client: req.idempotency.scope });
  }, { scope: (req) => req.get('X-Client') });
  // Keys that expire at once (remembered after that), per client.
  route('/short-lived-notes', async (req, res) => {
    const { rows: [note] } = await insertNote(req);
    res.status(201).json({ id: Number(note.id), text: req.body.text });
  }, { pool: shortTtlPool(pool), scope: (req) => req.get('X-Client') });
  route('/async-scope-notes', async (req, res) => {
    await insertNote(req);
    res.status(201).json({});
  }, { scope: async (req) => Number(req.get('X-User')) || null });
  app.post('/raw', express.raw({ type: '*/*' }), idempotent(options, async (req, res) => {
    await req.db.query('INSERT INTO node_notes (text) VALUES ($1)', [req.body.toString('hex')]);
    res.status(201).send(req.body);
  }));

  app.use((error, req, res, next) => {
    if (req.path === '/throws' || req.path === '/next-error')
      return next(error); // Express's own error page, like the trial
    res.status(500).json({ error: error.message, code: error.code ?? null, name: error.name });
  });
  return app;
}

before(async () => {
  pool = createPool(4);
  db = createPool(2);
  await db.query('CREATE TABLE IF NOT EXISTS node_notes (id bigserial PRIMARY KEY, text text NOT NULL)');
  ({ server, port } = await listen(createApp()));
});

after(async () => {
  server.close();
  await pool.end();
  await db.end();
});

test('first request runs and commits; a retry replays status, body, content type and headers with their casing', async () => {
  const key = randomUUID();
  const text = `note ${key}`;
  const first = await postJson(port, '/notes', key, { text });
  assert.equal(first.status, 201);
  assert.equal(first.header('Idempotent-Replayed'), undefined);
  const retry = await postJson(port, '/notes', key, { text });
  assert.equal(retry.status, 201);
  assert.deepEqual(retry.body, first.body);
  assert.equal(retry.header('Idempotent-Replayed'), 'true');
  const names = retry.rawHeaders.map(([name]) => name);
  assert.ok(names.includes('ETag'), `ETag with its casing among ${names}`);
  assert.ok(names.includes('Location'), `Location with its casing among ${names}`);
  assert.equal(retry.header('ETag'), first.header('ETag'));
  assert.equal(retry.header('Location'), first.header('Location'));
  assert.equal(retry.header('Content-Type'), 'application/json; charset=utf-8');
  assert.equal(await rows(text), 1);
  const stored = await storedResponse(key);
  assert.equal(stored.status, 201);
  assert.deepEqual(Object.keys(stored.headers).sort(), ['Content-Type', 'ETag', 'Location']);
});

test('writeHead headers are captured; only replayable ones are stored', async () => {
  const key = randomUUID();
  const first = await postJson(port, '/write-head', key, { text: key });
  assert.equal(first.status, 202);
  assert.equal(first.header('X-Other'), 'not replayed');
  const retry = await postJson(port, '/write-head', key, { text: key });
  assert.equal(retry.status, 202);
  assert.equal(retry.text, '{"accepted":true}');
  assert.equal(retry.header('ETag'), 'W/"7"');
  assert.equal(retry.header('X-Other'), undefined);
  assert.equal(await rows(key), 1);
});

for (const status of [400, 402, 404, 409, 422, 500, undefined]) {
  test(`a handler that throws an error with status ${status} after writing commits nothing`, async () => {
    const key = randomUUID();
    const text = `throws ${key}`;
    const first = await postJson(port, '/throws', key, { text, status });
    assert.equal(first.status, status ?? 500); // Express's error page, with the error's status
    assert.equal(await rows(text), 0);
    assert.equal(await keyState(key), 'absent');
    const retry = await postJson(port, '/throws', key, { text, status });
    assert.equal(retry.header('Idempotent-Replayed'), undefined, 'the error page is not replayed');
    assert.equal(await rows(text), 0);
  });
}

test('next(error) after writing commits nothing', async () => {
  const key = randomUUID();
  const text = `next ${key}`;
  const first = await postJson(port, '/next-error', key, { text });
  assert.equal(first.status, 402);
  assert.equal(await rows(text), 0);
  assert.equal(await keyState(key), 'absent');
});

for (const status of [408, 409, 425, 429, 500, 503]) {
  test(`a ${status} answer is never stored and rolls back; the retry runs again`, async () => {
    const key = randomUUID();
    const text = `status ${status} ${key}`;
    const first = await postJson(port, '/status-validation-stored', key, { text, status });
    assert.equal(first.status, status);
    assert.equal(await rows(text), 0);
    assert.equal(await keyState(key), 'absent');
  });
}

for (const status of [400, 422]) {
  test(`a validation ${status} is not stored by default: the client fixes the body and retries with the same key`, async () => {
    const key = randomUUID();
    const typo = await postJson(port, '/status', key, { text: `typo ${key}`, status });
    assert.equal(typo.status, status);
    assert.equal(await rows(`typo ${key}`), 0);
    const fixed = await postJson(port, '/status', key, { text: `fixed ${key}`, status: 201 });
    assert.equal(fixed.status, 201);
    assert.equal(fixed.header('Idempotent-Replayed'), undefined);
    assert.equal(await rows(`fixed ${key}`), 1);
  });

  test(`a validation ${status} is stored when the route sets storeValidationErrors`, async () => {
    const key = randomUUID();
    const text = `stored ${status} ${key}`;
    assert.equal((await postJson(port, '/status-validation-stored', key, { text, status })).status, status);
    const retry = await postJson(port, '/status-validation-stored', key, { text, status });
    assert.equal(retry.status, status);
    assert.equal(retry.header('Idempotent-Replayed'), 'true');
    assert.equal(await rows(text), 1);
  });
}

for (const status of [402, 404, 201, 302]) {
  test(`a ${status} answer is stored with its work and replayed`, async () => {
    const key = randomUUID();
    const text = `kept ${status} ${key}`;
    assert.equal((await postJson(port, '/status', key, { text, status })).status, status);
    const retry = await postJson(port, '/status', key, { text, status });
    assert.equal(retry.status, status);
    assert.equal(retry.header('Idempotent-Replayed'), 'true');
    assert.equal(await rows(text), 1);
  });
}

test('req.db used after the response is a SealedError: nothing runs in autocommit, nothing commits', async () => {
  const key = randomUUID();
  const text = `audit ${key}`;
  const answer = await postJson(port, '/audit-after-answer', key, { text });
  assert.equal(answer.status, 500);
  assert.equal(JSON.parse(answer.text).code, 'ERR_IDEMPOTENCY_SEALED');
  assert.equal(await rows(text), 0);
  assert.equal(await rows(`audit ${text}`), 0);
  assert.equal(await keyState(key), 'absent');
});

test('req.db used from a callback after the response throws SealedError, and the response commits', async () => {
  const key = randomUUID();
  const text = `callback ${key}`;
  held.set('callback-result', gate());
  const answer = await postJson(port, '/audit-in-callback', key, { text });
  assert.equal(answer.status, 201);
  const error = await held.get('callback-result').promise;
  assert.ok(error instanceof SealedError, `got ${error}`);
  assert.equal(error.code, 'ERR_IDEMPOTENCY_SEALED');
  assert.equal(await rows(text), 1);
  held.delete('callback-result');
});

test('a sealed handle cannot reach another request\'s transaction through a shared pool client', async () => {
  // A pool of one client: after the first request, the client serves the
  // second. A late use of the first request's handle must fail, not run in
  // the second's transaction.
  const single = createPool(1);
  let firstHandle;
  const app = express();
  const second = gate();
  app.post('/one', express.json(), idempotent({ pool: single, scope: SHARED_KEYS }, async (req, res) => {
    firstHandle = req.db;
    await insertNote(req);
    res.status(201).json({});
  }));
  app.post('/two', express.json(), idempotent({ pool: single, scope: SHARED_KEYS }, async (req, res) => {
    await insertNote(req);
    await second.promise;
    res.status(201).json({});
  }));
  const { server: one, port: onePort } = await listen(app);
  try {
    const text = `one ${randomUUID()}`;
    assert.equal((await postJson(onePort, '/one', randomUUID(), { text })).status, 201);
    const twoText = `two ${randomUUID()}`;
    const pending = postJson(onePort, '/two', randomUUID(), { text: twoText });
    await waitFor(async () => (await db.query(
      "SELECT count(*)::int AS n FROM pg_stat_activity WHERE state = 'idle in transaction' AND datname = current_database()")).rows[0].n > 0,
    'the second request to hold the client');
    assert.throws(() => firstHandle.query("INSERT INTO node_notes (text) VALUES ('late')"), SealedError);
    second.open();
    assert.equal((await pending).status, 201);
    assert.equal(await rows('late'), 0);
    assert.equal(await rows(twoText), 1);
  } finally {
    second.open();
    one.close();
    await single.end();
  }
});

const BODIES = [
  ['binary with 0xff 0xfe', 'application/octet-stream', Buffer.from([0x25, 0x50, 0xff, 0xfe, 0x41])],
  ['binary with NUL', 'application/pdf', Buffer.from([0x25, 0x50, 0x44, 0x46, 0x00, 0x01, 0x00])],
  ['a lone UTF-8 continuation byte', 'text/plain', Buffer.from([0x61, 0x80, 0x62])],
  ['a UTF-8 byte order mark', 'text/plain; charset=utf-8', Buffer.from([0xef, 0xbb, 0xbf, 0x68, 0x69])],
  ['UTF-8 text', 'text/html; charset=utf-8', Buffer.from('<p>naïve – ✓ 😀</p>')],
  ['JSON', 'application/json', Buffer.from('{"b": 1,  "a":[1.50, "x"]}')],
  ['empty', 'text/plain', Buffer.alloc(0)],
];
for (const [what, type, bytes] of BODIES) {
  test(`a ${what} body is replayed byte for byte with its content type`, async () => {
    const key = randomUUID();
    const request = { text: `body ${key}`, type, base64: bytes.toString('base64') };
    const first = await postJson(port, '/body', key, request);
    assert.equal(first.status, 200);
    assert.deepEqual(first.body, bytes);
    const retry = await postJson(port, '/body', key, request);
    assert.equal(retry.header('Idempotent-Replayed'), 'true');
    assert.deepEqual(retry.body, bytes);
    assert.equal(retry.header('Content-Type'), first.header('Content-Type'));
    const stored = await storedResponse(key);
    const binary = bytes.includes(0) || what.includes('0xff') || what.includes('continuation');
    assert.equal(stored.body_encoding, binary ? 'base64' : undefined);
    assert.equal(await rows(`body ${key}`), 1);
  });
}

test('a text body with non-ASCII characters replays byte for byte', async () => {
  const key = randomUUID();
  const first = await postJson(port, '/text', key, { text: key });
  const retry = await postJson(port, '/text', key, { text: key });
  assert.deepEqual(retry.body, first.body);
  assert.equal(retry.text, `héllo ${key} ✓`);
  assert.equal(retry.header('Content-Type'), 'text/plain; charset=utf-8');
});

test('a streamed response is held back, stored whole and replayed', async () => {
  const key = randomUUID();
  const first = await postJson(port, '/stream', key, { text: `stream ${key}`, lines: 200 });
  assert.equal(first.status, 200);
  assert.equal(first.text.split('\n').length, 201);
  const retry = await postJson(port, '/stream', key, { text: `stream ${key}`, lines: 200 });
  assert.equal(retry.header('Idempotent-Replayed'), 'true');
  assert.deepEqual(retry.body, first.body);
  assert.equal(retry.header('Content-Type'), first.header('Content-Type'));
  assert.equal(await rows(`stream ${key}`), 1);
});

test('a streamed response over maxBodyBytes is refused with 500 response-too-large and commits nothing', async () => {
  const key = randomUUID();
  const text = `big stream ${key}`;
  const answer = await postJson(port, '/stream', key, { text, lines: 1000 });
  assert.equal(answer.status, 500);
  assert.equal(answer.header('Content-Type'), 'application/problem+json');
  assert.equal(JSON.parse(answer.text).type, 'urn:idempotency:problem:response-too-large');
  assert.equal(await rows(text), 0);
  assert.equal(await keyState(key), 'absent');
});

test('the quoted (Structured Field String) and the bare key are the same key', async () => {
  const key = `k-${randomUUID()}`;
  const text = `quoted ${key}`;
  assert.equal((await postJson(port, '/notes', `"${key}"`, { text })).status, 201);
  const bare = await postJson(port, '/notes', key, { text });
  assert.equal(bare.header('Idempotent-Replayed'), 'true');
  const escaped = `e-${randomUUID()}`;
  assert.equal((await postJson(port, '/notes', `"${escaped}\\"q\\\\"`, { text: escaped })).status, 201);
  assert.equal(await keyState(`${escaped}"q\\`), 'done');
});

async function assertInvalidKey(headerValue, detailPattern) {
  const text = `invalid ${randomUUID()}`;
  const answer = await postJson(port, '/notes', headerValue, { text });
  assert.equal(answer.status, 400);
  assert.equal(answer.header('Content-Type'), 'application/problem+json');
  const problem = JSON.parse(answer.text);
  assert.equal(problem.type, 'urn:idempotency:problem:invalid-idempotency-key');
  assert.match(problem.detail, detailPattern);
  assert.equal(await rows(text), 0);
}

test('non-ASCII keys are refused with 400, never mangled: 100 and 50 times é as UTF-8 bytes', async () => {
  const utf8AsLatin1 = (text) => Buffer.from(text, 'utf8').toString('latin1');
  await assertInvalidKey(utf8AsLatin1('é'.repeat(100)), /non-ASCII/);
  await assertInvalidKey(utf8AsLatin1('é'.repeat(50)), /non-ASCII/);
  await assertInvalidKey(utf8AsLatin1('"clé"'), /non-ASCII/);
  await assertInvalidKey('\xe9t\xe9', /non-ASCII/); // latin1 bytes
});

test('control characters, bad quoting, empty and over-long keys are refused with 400', async () => {
  await assertInvalidKey('a\tb', /control/);
  // Node's HTTP parser refuses other control bytes itself, with a 400.
  assert.equal((await postJson(port, '/notes', 'a\x01b', { text: 'x' })).status, 400);
  assert.equal((await postJson(port, '/notes', '"a\x7fb"', { text: 'x' })).status, 400);
  await assertInvalidKey('"abc', /closing quote/);
  await assertInvalidKey('"a\\bc"', /backslash/);
  await assertInvalidKey('""', /1 to 255 bytes/);
  await assertInvalidKey('k'.repeat(256), /1 to 255 bytes/);
  await assertInvalidKey(`"${'k'.repeat(256)}"`, /1 to 255 bytes/);
  const text = `two keys ${randomUUID()}`;
  const twice = await postJson(port, '/notes', 'a', { text }, [['Idempotency-Key', 'b']]);
  assert.equal(twice.status, 400);
  assert.equal(await rows(text), 0);
  const longest = 'k'.repeat(219) + randomUUID().slice(0, 36);
  assert.equal((await postJson(port, '/notes', longest, { text: longest })).status, 201);
});

test('a failing handler\'s headers do not reach the error answer; earlier middleware\'s do', async () => {
  const text = `cors ${randomUUID()}`;
  const failed = await postJson(port, '/cors-throws', randomUUID(), { text });
  assert.equal(failed.status, 500);
  assert.equal(failed.header('Access-Control-Allow-Origin'), '*');
  assert.equal(failed.header('Location'), undefined);
  assert.equal(await rows(text), 0);
  const invalid = await postJson(port, '/cors-throws', '', { text });
  assert.equal(invalid.status, 400);
  assert.equal(invalid.header('Access-Control-Allow-Origin'), '*');
});

test('a missing key is 400 on a route that requires one; without required it runs in a plain transaction', async () => {
  const text = `missing ${randomUUID()}`;
  const answer = await postJson(port, '/notes', undefined, { text });
  assert.equal(answer.status, 400);
  assert.equal(JSON.parse(answer.text).type, 'urn:idempotency:problem:missing-idempotency-key');
  const optional = await postJson(port, '/optional', undefined, { text });
  assert.equal(optional.status, 201);
  assert.equal(await rows(text), 1);
});

test('the same key with another body is 422; the same JSON with members reordered replays', async () => {
  const key = randomUUID();
  const text = `fp ${key}`;
  assert.equal((await rawRequest(port, { path: '/notes', headers: [['Content-Type', 'application/json'], ['Idempotency-Key', key]],
    body: `{"text": "${text}", "n": 1}` })).status, 201);
  const reordered = await rawRequest(port, { path: '/notes', headers: [['Content-Type', 'application/json'], ['Idempotency-Key', key]],
    body: `{ "n":1.0, "text":"${text}" }` });
  assert.equal(reordered.header('Idempotent-Replayed'), 'true');
  const other = await postJson(port, '/notes', key, { text, n: 2 });
  assert.equal(other.status, 422);
  assert.equal(JSON.parse(other.text).type, 'urn:idempotency:problem:idempotency-key-reused');
  const otherPath = await rawRequest(port, { path: '/notes?x=1', headers: [['Content-Type', 'application/json'], ['Idempotency-Key', key]],
    body: `{"text": "${text}", "n": 1}` });
  assert.equal(otherPath.status, 422);
  assert.equal(await rows(text), 1);
});

test('a raw body is fingerprinted by its bytes', async () => {
  const key = randomUUID();
  const bytes = Buffer.from([1, 2, 3, 0xff]);
  const headers = [['Content-Type', 'application/octet-stream'], ['Idempotency-Key', key]];
  const first = await rawRequest(port, { path: '/raw', headers, body: bytes });
  assert.equal(first.status, 201);
  const retry = await rawRequest(port, { path: '/raw', headers, body: bytes });
  assert.equal(retry.header('Idempotent-Replayed'), 'true');
  assert.deepEqual(retry.body, bytes);
  const other = await rawRequest(port, { path: '/raw', headers, body: Buffer.from([1, 2, 3, 0xfe]) });
  assert.equal(other.status, 422);
});

test('a duplicate while the first request runs is 409 with Retry-After; with waitTimeout it waits and replays', async () => {
  const key = randomUUID();
  const text = `held ${key}`;
  held.set(text, gate());
  const first = postJson(port, '/notes', key, { text });
  // Its handler has inserted, so its claim came before: a session merely
  // idle in transaction may be between BEGIN and the claim.
  await waitFor(async () => (await db.query(
    "SELECT count(*)::int AS n FROM pg_stat_activity WHERE state = 'idle in transaction' AND query LIKE 'INSERT INTO node_notes%' AND datname = current_database()")).rows[0].n === 1,
  'the first request to hold its key');
  const duplicate = await postJson(port, '/notes', key, { text });
  assert.equal(duplicate.status, 409);
  assert.equal(duplicate.header('Retry-After'), '1');
  assert.equal(JSON.parse(duplicate.text).type, 'urn:idempotency:problem:request-in-progress');
  held.get(text).open();
  assert.equal((await first).status, 201);
  held.delete(text);

  // The waiting route: a duplicate waits for the first, then replays it.
  const waitKey = randomUUID();
  const waitText = `wait ${waitKey}`;
  const holder = await pool.connect();
  try {
    await holder.query('BEGIN');
    await holder.query('LOCK TABLE node_notes IN SHARE MODE'); // holds the first request's INSERT
    const firstWaiting = postJson(port, '/notes-waiting', waitKey, { text: waitText });
    await waitFor(async () => (await db.query(
      "SELECT count(*)::int AS n FROM pg_stat_activity WHERE wait_event_type = 'Lock' AND datname = current_database()")).rows[0].n === 1,
    'the first request to wait for the table');
    const secondWaiting = postJson(port, '/notes-waiting', waitKey, { text: waitText });
    await waitFor(async () => (await db.query(
      "SELECT count(*)::int AS n FROM pg_stat_activity WHERE wait_event_type = 'Lock' AND datname = current_database()")).rows[0].n === 2,
    'the duplicate to wait for the key');
    await holder.query('COMMIT');
    const [one, two] = await Promise.all([firstWaiting, secondWaiting]);
    assert.equal(one.status, 201);
    assert.equal(two.status, 201);
    assert.equal(two.header('Idempotent-Replayed'), 'true');
    assert.deepEqual(two.body, one.body);
    assert.equal(await rows(waitText), 1);
  } finally {
    holder.release();
  }
});

test('a retry after the response expired is 410 request-already-ran and runs nothing; another body is 422', async () => {
  const key = randomUUID();
  const text = `gone ${key}`;
  const client = [['X-Client', 'alice']];
  assert.equal((await postJson(port, '/short-lived-notes', key, { text }, client)).status, 201);
  await waitUntilGone(db, scopedKey('alice', key));
  const retry = await postJson(port, '/short-lived-notes', key, { text }, client);
  assert.equal(retry.status, 410);
  assert.equal(retry.header('Content-Type'), 'application/problem+json');
  assert.equal(retry.header('Idempotent-Replayed'), undefined);
  // The same document as the Python and Go packages'.
  assert.deepEqual(JSON.parse(retry.text), {
    type: 'urn:idempotency:problem:request-already-ran',
    title: 'This request already ran; its response is no longer kept',
    status: 410,
    detail: 'A request with this Idempotency-Key was processed before and its response has expired; '
      + 'it is not run again.',
  });
  assert.equal(await rows(text), 1, 'the handler did not run again');
  const other = await postJson(port, '/short-lived-notes', key, { text: `${text} other` }, client);
  assert.equal(other.status, 422);
  assert.equal(JSON.parse(other.text).type, 'urn:idempotency:problem:idempotency-key-reused');
  assert.equal(await rows(`${text} other`), 0);
  // Another client's same key is another key: its request runs.
  assert.equal((await postJson(port, '/short-lived-notes', key, { text }, [['X-Client', 'bob']])).status, 201);
  assert.equal(await rows(text), 2);
});

for (const code of ['IK409', 'IK410', 'IK422', '22023']) {
  test(`the handler's own SQL error ${code} stays the handler's: no IK problem answer`, async () => {
    const answer = await postJson(port, '/handler-sql-error', randomUUID(), { code });
    assert.equal(answer.status, 500);
    assert.equal(JSON.parse(answer.text).code, code);
  });
}

test('the same key and body from another client runs for that client; the owner still replays', async () => {
  const key = randomUUID();
  const text = `alice and bob ${key}`;
  const alice = await postJson(port, '/client-notes', key, { text }, [['X-Client', 'alice']]);
  assert.equal(alice.status, 201);
  const bob = await postJson(port, '/client-notes', key, { text }, [['X-Client', 'bob']]);
  assert.equal(bob.status, 201);
  assert.equal(bob.header('Idempotent-Replayed'), undefined);
  assert.equal(JSON.parse(bob.text).client, 'bob');
  assert.notEqual(JSON.parse(bob.text).id, JSON.parse(alice.text).id);
  assert.equal(await rows(text), 2);
  const retry = await postJson(port, '/client-notes', key, { text }, [['X-Client', 'alice']]);
  assert.equal(retry.header('Idempotent-Replayed'), 'true');
  assert.deepEqual(retry.body, alice.body);
  // The database holds each client's key under its derived form only.
  assert.equal((await storedResponse(scopedKey('alice', key))).body, alice.text);
  assert.equal((await storedResponse(scopedKey('bob', key))).body, bob.text);
  assert.equal(await keyState(key), 'absent');
});

test('another client\'s key with another body reveals nothing: no 422', async () => {
  const key = randomUUID();
  const text = `probe ${key}`;
  assert.equal((await postJson(port, '/client-notes', key, { text }, [['X-Client', 'alice']])).status, 201);
  const probe = await postJson(port, '/client-notes', key, { text: `${text} other` }, [['X-Client', 'mallory']]);
  assert.equal(probe.status, 201);
  assert.equal(await rows(`${text} other`), 1);
  const reused = await postJson(port, '/client-notes', key, { text: `${text} other` }, [['X-Client', 'alice']]);
  assert.equal(reused.status, 422);
});

test('a request whose scope is empty is refused with 401 and runs nothing; async scopes work', async () => {
  const text = `nobody ${randomUUID()}`;
  const answer = await postJson(port, '/client-notes', randomUUID(), { text });
  assert.equal(answer.status, 401);
  assert.equal(answer.header('Content-Type'), 'application/problem+json');
  assert.equal(JSON.parse(answer.text).type, 'urn:idempotency:problem:principal-required');
  assert.equal((await postJson(port, '/async-scope-notes', randomUUID(), { text })).status, 401);
  assert.equal(await rows(text), 0);
  const key = randomUUID();
  assert.equal((await postJson(port, '/async-scope-notes', key, { text }, [['X-User', '7']])).status, 201);
  assert.equal(await keyState(scopedKey(7, key)), 'done');
  assert.equal(await keyState(scopedKey('7', key)), 'done');
});

test('a 255-byte key within a scope is stored under its hashed form and replays', async () => {
  const key = `${'L'.repeat(219)}${randomUUID()}`;
  const text = `long ${randomUUID()}`;
  assert.equal((await postJson(port, '/client-notes', key, { text }, [['X-Client', 'acme']])).status, 201);
  const retry = await postJson(port, '/client-notes', key, { text }, [['X-Client', 'acme']]);
  assert.equal(retry.header('Idempotent-Replayed'), 'true');
  assert.match(scopedKey('acme', key), /^§[0-9a-f]{32}#[0-9a-f]{64}$/);
  assert.equal(await keyState(scopedKey('acme', key)), 'done');
});

test('a route must name its scope, or share its keys with SHARED_KEYS', () => {
  for (const scope of [undefined, null, 'alice', 42])
    assert.throws(() => idempotent({ pool, scope }, () => {}), /options\.scope/, String(scope));
  assert.doesNotThrow(() => idempotent({ pool, scope: SHARED_KEYS }, () => {}));
});

test('no late errors were reported by the tests above', () => {
  assert.deepEqual(lateErrors.map(String), []);
});
