'use strict';
// End-to-end test of the payment service: starts server.js on 127.0.0.1,
// drives it with real HTTP requests and checks what a client sees (status
// codes, headers, bodies) and what the database holds (balances, ledger rows).
// Needs PGHOST/PGPORT/PGDATABASE/PGUSER of a database where schema.sql is
// loaded and the idempotency extension is created.

const { test, before, after } = require('node:test');
const assert = require('node:assert/strict');
const { spawn } = require('node:child_process');
const { once } = require('node:events');
const { randomUUID } = require('node:crypto');
const net = require('node:net');
const path = require('node:path');
const { Client } = require('pg');

const PROBLEM_BASE = 'https://payments.example/problems/';
const run = randomUUID().slice(0, 8); // keeps keys apart across runs

let server;
let baseUrl;
let port;
let db;

function newKey(name) {
  return `${run}-${name}`;
}

async function startServer() {
  const child = spawn(process.execPath, [path.join(__dirname, 'server.js')], {
    env: { ...process.env, PORT: '0' },
    stdio: ['ignore', 'pipe', 'inherit'],
  });
  let output = '';
  for await (const chunk of child.stdout) {
    output += chunk;
    const match = output.match(/listening on (http:\/\/127\.0\.0\.1:(\d+))/);
    if (match)
      return { child, url: match[1], port: Number(match[2]) };
  }
  throw new Error(`server exited before listening: ${output}`);
}

async function stopServer(child) {
  if (child.exitCode !== null)
    return;
  const exited = once(child, 'exit');
  child.kill('SIGTERM');
  const timer = setTimeout(() => child.kill('SIGKILL'), 3000);
  await exited;
  clearTimeout(timer);
}

async function post(key, body) {
  const headers = { 'Content-Type': 'application/json' };
  if (key !== undefined)
    headers['Idempotency-Key'] = key;
  const response = await fetch(`${baseUrl}/withdrawals`, {
    method: 'POST', headers, body: JSON.stringify(body),
  });
  const text = await response.text();
  return {
    status: response.status,
    headers: response.headers,
    text,
    body: JSON.parse(text),
    replayed: response.headers.get('idempotent-replayed') === 'true',
  };
}

async function createAccount(balance) {
  const { rows } = await db.query(
    `INSERT INTO accounts (id, balance)
     SELECT coalesce(max(id), 0) + 1, $1 FROM accounts RETURNING id`, [balance]);
  return Number(rows[0].id);
}

async function balanceOf(account) {
  const { rows } = await db.query('SELECT balance FROM accounts WHERE id = $1', [account]);
  return Number(rows[0].balance);
}

async function ledgerOf(account) {
  const { rows } = await db.query(
    'SELECT id, amount FROM ledger WHERE account_id = $1 ORDER BY id', [account]);
  return rows.map((row) => ({ id: Number(row.id), amount: Number(row.amount) }));
}

async function waitFor(condition, what) {
  const deadline = Date.now() + 10000;
  while (!(await condition())) {
    if (Date.now() > deadline)
      throw new Error(`timed out waiting for ${what}`);
    await new Promise((resolve) => setTimeout(resolve, 20));
  }
}

function assertProblem(response, status, type) {
  assert.equal(response.status, status);
  assert.equal(response.headers.get('content-type'), 'application/problem+json');
  assert.equal(response.body.type, PROBLEM_BASE + type);
  assert.equal(response.body.status, status);
  assert.equal(typeof response.body.title, 'string');
}

before(async () => {
  db = new Client();
  await db.connect();
  ({ child: server, url: baseUrl, port } = await startServer());
});

after(async () => {
  await stopServer(server);
  await db.end();
});

test('a first call withdraws and answers 201 with the response', async () => {
  const account = await createAccount(1000);
  const response = await post(newKey('first'), { account_id: account, amount: 300 });

  assert.equal(response.status, 201);
  assert.equal(response.headers.get('idempotent-replayed'), null);
  const ledger = await ledgerOf(account);
  assert.deepEqual(response.body, {
    withdrawal_id: ledger[0].id, account_id: account, amount: 300, balance: 700,
  });
  assert.deepEqual(ledger.map((entry) => entry.amount), [-300]);
  assert.equal(await balanceOf(account), 700);
});

test('a replay answers the same status and body with Idempotent-Replayed: true', async () => {
  const account = await createAccount(1000);
  const key = newKey('replay');
  const first = await post(key, { account_id: account, amount: 300 });
  const second = await post(key, { account_id: account, amount: 300 });
  const third = await post(key, { account_id: account, amount: 300 });

  assert.equal(first.status, 201);
  for (const replay of [second, third]) {
    assert.equal(replay.status, first.status);
    assert.equal(replay.text, first.text);
    assert.equal(replay.headers.get('idempotent-replayed'), 'true');
  }
  assert.equal((await ledgerOf(account)).length, 1);
  assert.equal(await balanceOf(account), 700);
});

test('the same key with a different body is 422 problem details, nothing runs', async () => {
  const account = await createAccount(1000);
  const key = newKey('reused');
  assert.equal((await post(key, { account_id: account, amount: 300 })).status, 201);

  const otherAmount = await post(key, { account_id: account, amount: 500 });
  assertProblem(otherAmount, 422, 'idempotency-key-reused');
  const otherAccount = await post(key, { account_id: await createAccount(1000), amount: 300 });
  assertProblem(otherAccount, 422, 'idempotency-key-reused');

  assert.equal((await ledgerOf(account)).length, 1);
  assert.equal(await balanceOf(account), 700);
});

test('a missing Idempotency-Key is 400 and withdraws nothing', async () => {
  const account = await createAccount(1000);
  const response = await post(undefined, { account_id: account, amount: 300 });

  assertProblem(response, 400, 'missing-idempotency-key');
  assert.equal((await ledgerOf(account)).length, 0);
  assert.equal(await balanceOf(account), 1000);
});

test('an empty or over-long key is rejected by the extension (22023) as 400', async () => {
  const account = await createAccount(1000);
  for (const key of ['', 'k'.repeat(256)]) {
    const response = await post(key, { account_id: account, amount: 300 });
    assertProblem(response, 400, 'invalid-idempotency-key');
  }
  const longest = await post('k'.repeat(255) /* the limit */, { account_id: account, amount: 300 });
  assert.equal(longest.status, 201);
  assert.equal((await ledgerOf(account)).length, 1);
});

test('a key in progress in another transaction is 409 with Retry-After, then replays', async () => {
  const account = await createAccount(1000);
  const key = newKey('in-progress');
  // Another worker runs the same withdrawal and has not committed yet.
  const holder = new Client();
  await holder.connect();
  try {
    await holder.query('BEGIN');
    const held = await holder.query(
      `SELECT idempotency.idempotent_call($1, NULL, 'SELECT withdraw($1, $2)',
                                          $2::bigint, $3::bigint) AS response`,
      [key, account, 300]);

    const busy = await post(key, { account_id: account, amount: 300 });
    assertProblem(busy, 409, 'request-in-progress');
    assert.equal(busy.headers.get('retry-after'), '1');

    await holder.query('COMMIT');
    const retried = await post(key, { account_id: account, amount: 300 });
    assert.equal(retried.status, 201);
    assert.equal(retried.headers.get('idempotent-replayed'), 'true');
    assert.deepEqual(retried.body, held.rows[0].response);
  } finally {
    await holder.end();
  }
  assert.equal((await ledgerOf(account)).length, 1);
  assert.equal(await balanceOf(account), 700);
});

test('a double click (two concurrent identical requests) withdraws once', async (t) => {
  const account = await createAccount(10000);
  const clicks = 10;
  let conflicts = 0;
  let replays = 0;
  for (let i = 0; i < clicks; i++) {
    const key = newKey(`double-click-${i}`);
    const body = { account_id: account, amount: 100 };
    const pair = await Promise.all([post(key, body), post(key, body)]);

    const fresh = pair.filter((r) => r.status === 201 && !r.replayed);
    assert.equal(fresh.length, 1, `exactly one request ran: ${pair.map((r) => r.status)}`);
    const other = pair.find((r) => r !== fresh[0]);
    if (other.status === 409) {
      conflicts++;
      assertProblem(other, 409, 'request-in-progress');
      assert.equal(other.headers.get('retry-after'), '1');
    } else {
      replays++;
      assert.equal(other.status, 201);
      assert.equal(other.headers.get('idempotent-replayed'), 'true');
      assert.equal(other.text, fresh[0].text);
    }
  }
  t.diagnostic(`second clicks: ${conflicts} answered 409, ${replays} replayed`);
  assert.equal((await ledgerOf(account)).length, clicks);
  assert.equal(await balanceOf(account), 10000 - clicks * 100);
});

test('a retry after a dropped response replays it and debits once', async () => {
  const account = await createAccount(1000);
  const key = newKey('dropped');
  const payload = JSON.stringify({ account_id: account, amount: 250 });

  // The client sends the request and loses the connection before it reads
  // the answer: it never learns whether the withdrawal happened.
  const socket = net.connect(port, '127.0.0.1');
  await once(socket, 'connect');
  socket.pause();
  socket.write(
    'POST /withdrawals HTTP/1.1\r\nHost: 127.0.0.1\r\n' +
    `Idempotency-Key: ${key}\r\nContent-Type: application/json\r\n` +
    `Content-Length: ${Buffer.byteLength(payload)}\r\n\r\n${payload}`);
  await waitFor(async () => (await ledgerOf(account)).length === 1, 'the first request to commit');
  socket.destroy();

  const retried = await post(key, JSON.parse(payload));
  assert.equal(retried.status, 201);
  assert.equal(retried.headers.get('idempotent-replayed'), 'true');
  const ledger = await ledgerOf(account);
  assert.deepEqual(ledger.map((entry) => entry.amount), [-250]);
  assert.equal(retried.body.withdrawal_id, ledger[0].id);
  assert.equal(await balanceOf(account), 750);
});

test('insufficient funds is 422, is not stored, and the same request may succeed later', async () => {
  const account = await createAccount(100);
  const key = newKey('insufficient');
  const refused = await post(key, { account_id: account, amount: 300 });
  assertProblem(refused, 422, 'insufficient-funds');
  assert.equal(await balanceOf(account), 100);

  await db.query('UPDATE accounts SET balance = balance + 500 WHERE id = $1', [account]);
  const retried = await post(key, { account_id: account, amount: 300 });
  assert.equal(retried.status, 201);
  assert.equal(retried.headers.get('idempotent-replayed'), null);
  assert.equal(await balanceOf(account), 300);
});

test('an unknown account is 404 and an invalid body is 400', async () => {
  assertProblem(await post(newKey('unknown'), { account_id: 999999, amount: 1 }), 404, 'account-not-found');
  assertProblem(await post(newKey('negative'), { account_id: 1, amount: -5 }), 400, 'invalid-body');
});
