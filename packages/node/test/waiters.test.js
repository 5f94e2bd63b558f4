'use strict';
// Many duplicates of one request on a route with waitTimeout, sent while the
// first holds its key: every one waits for it and, once it commits, replays
// its answer at once; none is answered 409 when its wait runs out.

const { test, before, after } = require('node:test');
const assert = require('node:assert/strict');
const { randomUUID } = require('node:crypto');
const express = require('express');
const { idempotent, SHARED_KEYS } = require('..');
const { createPool, listen, postJson, waitFor, gate } = require('./helpers');

const DUPLICATES = 20;
const WAIT = '20s';
const PROMPT_MS = 5000; // far below the wait: a bound, not a measure of speed

let pool;
let db;
let server;
let port;
const held = new Map(); // text -> gate the first request's handler waits for

before(async () => {
  pool = createPool(DUPLICATES + 4);
  db = createPool(2);
  await db.query('CREATE TABLE IF NOT EXISTS node_waiter_notes (id bigserial PRIMARY KEY, text text NOT NULL)');
  const app = express();
  app.post('/held-notes', express.json(), idempotent({ pool, scope: SHARED_KEYS, waitTimeout: WAIT }, async (req, res) => {
    const { rows: [note] } = await req.db.query(
      'INSERT INTO node_waiter_notes (text) VALUES ($1) RETURNING id', [req.body.text]);
    if (held.has(req.body.text))
      await held.get(req.body.text).promise;
    res.status(201).json({ id: Number(note.id), text: req.body.text });
  }));
  ({ server, port } = await listen(app));
});

after(async () => {
  server.close();
  await pool.end();
  await db.end();
});

async function waitingForLocks() {
  const { rows: [row] } = await db.query(
    "SELECT count(*)::int AS n FROM pg_stat_activity WHERE wait_event_type = 'Lock' AND datname = current_database()");
  return row.n;
}

test(`${DUPLICATES} duplicates sent while the first request holds its key all replay its answer once it commits`, async () => {
  const key = randomUUID();
  const text = `held ${key}`;
  held.set(text, gate());
  const first = postJson(port, '/held-notes', key, { text });
  await waitFor(async () => (await db.query('SELECT state FROM idempotency.lookup($1)', [key])).rows[0].state
    === 'in_progress', 'the first request to hold its key');
  const duplicates = Array.from({ length: DUPLICATES }, () => postJson(port, '/held-notes', key, { text })
    .then((answer) => ({ ...answer, at: Date.now() })));
  await waitFor(async () => (await waitingForLocks()) === DUPLICATES, `the ${DUPLICATES} duplicates to wait for the key`);
  held.get(text).open();
  const answered = await first;
  const committedAt = Date.now();
  held.delete(text);
  assert.equal(answered.status, 201);

  const answers = await Promise.all(duplicates);
  assert.deepEqual(answers.map((answer) => answer.status), Array(DUPLICATES).fill(201));
  for (const answer of answers) {
    assert.equal(answer.header('Idempotent-Replayed'), 'true');
    assert.deepEqual(answer.body, answered.body);
  }
  const latest = Math.max(...answers.map((answer) => answer.at)) - committedAt;
  assert.ok(latest < PROMPT_MS, `the last duplicate answered ${latest} ms after the first, within ${PROMPT_MS} ms`);
  const { rows: [row] } = await db.query('SELECT count(*)::int AS n FROM node_waiter_notes WHERE text = $1', [text]);
  assert.equal(row.n, 1);
});
