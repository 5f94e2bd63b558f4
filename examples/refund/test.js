'use strict';
// End-to-end test of keyed refunds: real refund.js processes against a real
// database, retried sequentially, concurrently and after a crash. A refund
// must be paid once, however often it is retried.
// Needs PGHOST/PGPORT/PGDATABASE/PGUSER of a database where schema.sql is
// loaded and the idempotency extension is created.

const { test, before, after } = require('node:test');
const assert = require('node:assert/strict');
const { spawn } = require('node:child_process');
const { once } = require('node:events');
const { randomUUID } = require('node:crypto');
const path = require('node:path');
const { Client } = require('pg');

const run = randomUUID().slice(0, 8); // keeps keys apart across runs
let db;

function start(...args) {
  const child = spawn(process.execPath, [path.join(__dirname, 'refund.js'), ...args], {
    stdio: ['ignore', 'pipe', 'pipe'],
  });
  let stdout = '';
  let stderr = '';
  child.stdout.on('data', (chunk) => { stdout += chunk; });
  child.stderr.on('data', (chunk) => { stderr += chunk; });
  const result = once(child, 'close').then(([code]) => ({
    code, stderr, output: stdout ? JSON.parse(stdout) : undefined,
  }));
  return { child, result };
}

const cli = (...args) => start(...args).result;

async function refunded(...args) {
  const result = await cli('refund', ...args);
  assert.equal(result.code, 0, result.stderr);
  return result.output;
}

async function scalar(sql, params = []) {
  const { rows } = await db.query(sql, params);
  return Number(Object.values(rows[0])[0]);
}

// An account that paid amount; returns the account's and the payment's ids.
async function createPayment(amount) {
  const { rows } = await db.query(
    `WITH account AS (
       INSERT INTO accounts (id, balance)
       SELECT coalesce(max(id), 0) + 1, 0 FROM accounts RETURNING id)
     INSERT INTO payments (id, account_id, amount)
     SELECT id, id, $1 FROM account RETURNING id`, [amount]);
  return Number(rows[0].id); // payment ids equal account ids here
}

const balanceOf = (account) => scalar('SELECT balance FROM accounts WHERE id = $1', [account]);
const refundsOf = (payment) => scalar('SELECT count(*) FROM refunds WHERE payment_id = $1', [payment]);
const refundedOf = (payment) => scalar('SELECT refunded FROM payments WHERE id = $1', [payment]);

async function waitFor(condition, what) {
  const deadline = Date.now() + 10000;
  while (!(await condition())) {
    if (Date.now() > deadline)
      throw new Error(`timed out waiting for ${what}`);
    await new Promise((resolve) => setTimeout(resolve, 20));
  }
}

before(async () => {
  db = new Client();
  await db.connect();
});

after(async () => {
  await db.end();
});

test('without a key, a retried refund pays twice (the hazard the key removes)', async () => {
  const payment = await createPayment(100);
  await db.query('SELECT refund($1, 30)', [payment]);
  await db.query('SELECT refund($1, 30)', [payment]); // the retry
  assert.equal(await refundsOf(payment), 2);
  assert.equal(await balanceOf(payment), 60);
});

test('a retried refund pays once and every retry gets the first answer', async () => {
  const payment = await createPayment(100);
  const key = `refund:ticket-${run}-1`;
  const first = await refunded(key, String(payment), '30');
  const second = await refunded(key, String(payment), '30');
  const third = await refunded(key, String(payment), '30');

  assert.equal(first.replayed, false);
  assert.deepEqual([second.replayed, third.replayed], [true, true]);
  assert.deepEqual(second.refund, first.refund);
  assert.deepEqual(third.refund, first.refund);
  assert.deepEqual(first.refund, {
    refund_id: first.refund.refund_id, payment_id: payment, amount: 30, refundable: 70,
  });
  assert.equal(await refundsOf(payment), 1);
  assert.equal(await balanceOf(payment), 30);
});

test('eight concurrent retries of one refund pay once', async () => {
  const payment = await createPayment(100);
  const key = `refund:ticket-${run}-2`;
  const results = await Promise.all(
    Array.from({ length: 8 }, () => cli('refund', key, String(payment), '40')));

  for (const result of results)
    assert.equal(result.code, 0, result.stderr);
  const outputs = results.map((result) => result.output);
  assert.equal(outputs.filter((output) => !output.replayed).length, 1);
  assert.equal(new Set(outputs.map((output) => output.refund.refund_id)).size, 1);
  assert.equal(await refundsOf(payment), 1);
  assert.equal(await balanceOf(payment), 40);
});

test('partial refunds each have their own key; errors are not stored', async () => {
  const payment = await createPayment(100);
  await refunded(`refund:ticket-${run}-3a`, String(payment), '30');
  const second = await refunded(`refund:ticket-${run}-3b`, String(payment), '50');
  assert.equal(second.replayed, false);
  assert.equal(second.refund.refundable, 20);

  // 50 more would exceed the payment: refused, and since nothing is stored
  // the retry is refused again rather than answered with IK422 or a replay.
  for (let attempt = 0; attempt < 2; attempt++) {
    const refused = await cli('refund', `refund:ticket-${run}-3c`, String(payment), '50');
    assert.equal(refused.code, 4, refused.stderr);
  }
  assert.equal(await refundsOf(payment), 2);
  assert.equal(await refundedOf(payment), 80);
  assert.equal(await balanceOf(payment), 80);
});

test('a key reused for a different refund is refused (IK422) and pays nothing', async () => {
  const payment = await createPayment(100);
  const key = `refund:ticket-${run}-4`;
  await refunded(key, String(payment), '30');
  const otherAmount = await cli('refund', key, String(payment), '31');
  assert.equal(otherAmount.code, 3, otherAmount.stderr);
  assert.match(otherAmount.stderr, /IK422/);
  assert.equal(await refundsOf(payment), 1);
  assert.equal(await balanceOf(payment), 30);
});

test('an empty key is refused by the extension (22023)', async () => {
  const payment = await createPayment(100);
  const result = await cli('refund', '', String(payment), '30');
  assert.equal(result.code, 2, result.stderr);
  assert.match(result.stderr, /22023/);
  assert.equal(await refundsOf(payment), 0);
});

test('a compensation run again after a crash pays the refund once', async () => {
  const payment = await createPayment(100);
  const transfer = payment;
  await db.query("INSERT INTO transfers (id, payment_id, status) VALUES ($1, $1, 'payout_failed')", [transfer]);

  // The orchestrator refunds, then dies (kill -9) before it records the
  // transfer as compensated: this test holds the transfer's row locked.
  const locker = new Client();
  await locker.connect();
  await locker.query('BEGIN');
  await locker.query('SELECT FROM transfers WHERE id = $1 FOR UPDATE', [transfer]);
  const orchestrator = start('compensate', String(transfer));
  await waitFor(async () => (await refundsOf(payment)) === 1, 'the refund to commit');
  await waitFor(async () => (await scalar(
    `SELECT count(*) FROM pg_stat_activity
      WHERE application_name = 'refund-example' AND wait_event_type = 'Lock'`)) === 1,
  'the orchestrator to block on marking the transfer');
  orchestrator.child.kill('SIGKILL');
  await orchestrator.result;
  // Its session dies with it (as when the orchestrator's host goes down);
  // left alone, the blocked autocommit UPDATE would still run and commit.
  await db.query(
    "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE application_name = 'refund-example'");
  await waitFor(async () => (await scalar(
    "SELECT count(*) FROM pg_stat_activity WHERE application_name = 'refund-example'")) === 0,
  'the orchestrator\'s session to end');
  await locker.query('ROLLBACK');
  await locker.end();
  assert.equal(await scalar('SELECT count(*) FROM transfers WHERE id = $1 AND status = $2',
    [transfer, 'payout_failed']), 1);

  const rerun = await cli('compensate', String(transfer));
  assert.equal(rerun.code, 0, rerun.stderr);
  assert.equal(rerun.output.replayed, true);
  assert.equal(await scalar('SELECT count(*) FROM transfers WHERE id = $1 AND status = $2',
    [transfer, 'compensated']), 1);
  assert.equal(await refundsOf(payment), 1);
  assert.equal(await balanceOf(payment), 100);
});
