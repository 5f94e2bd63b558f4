'use strict';
// End-to-end test of the inbox consumer: real consumer processes against a
// real database, with the redeliveries a broker makes. Each message's effect
// (a shipment row) must exist exactly once, whatever is delivered twice.
// Needs PGHOST/PGPORT/PGDATABASE/PGUSER of a database where schema.sql is
// loaded and the idempotency extension is created.

const { test, before, after } = require('node:test');
const assert = require('node:assert/strict');
const { spawn } = require('node:child_process');
const { once } = require('node:events');
const readline = require('node:readline');
const path = require('node:path');
const { Client } = require('pg');

const STOCK = 1000000;
let db;
let lastOrderId;

function startConsumer(...args) {
  const child = spawn(process.execPath, [path.join(__dirname, 'consumer.js'), '--drain', ...args], {
    stdio: ['ignore', 'pipe', 'inherit'],
  });
  const consumer = { child, lines: [], exited: once(child, 'exit').then(([code]) => code) };
  readline.createInterface({ input: child.stdout }).on('line', (line) => {
    consumer.lines.push(JSON.parse(line));
  });
  return consumer;
}

async function finished(consumer) {
  const code = await consumer.exited;
  assert.equal(code, 0, 'the consumer exits cleanly once the queue is drained');
  await new Promise((resolve) => setImmediate(resolve)); // let readline flush
  return consumer.lines;
}

async function waitFor(condition, what) {
  const deadline = Date.now() + 10000;
  while (!(await condition())) {
    if (Date.now() > deadline)
      throw new Error(`timed out waiting for ${what}`);
    await new Promise((resolve) => setTimeout(resolve, 20));
  }
}

async function scalar(sql, params = []) {
  const { rows } = await db.query(sql, params);
  return Number(Object.values(rows[0])[0]);
}

function nextOrders(count, skuOf = () => 'widget') {
  return Array.from({ length: count }, (_, i) => ({ id: ++lastOrderId, sku: skuOf(i), quantity: 2 }));
}

// Publishes one "order paid" message per order; its natural id is the key.
async function publish(orders) {
  await db.query(
    `INSERT INTO queue (message_id, payload)
     SELECT 'order-paid:' || o.id, jsonb_build_object('order_id', o.id, 'sku', o.sku, 'quantity', o.quantity)
       FROM jsonb_to_recordset($1::jsonb) AS o(id bigint, sku text, quantity integer)
      ORDER BY o.id`,
    [JSON.stringify(orders)]);
}

// Shipments per order, for the given orders.
async function shipmentsPerOrder(orders) {
  const { rows } = await db.query(
    `SELECT o.id, count(s.id) AS shipments
       FROM unnest($1::bigint[]) AS o(id) LEFT JOIN shipments s ON s.order_id = o.id
      GROUP BY o.id`,
    [orders.map((order) => order.id)]);
  return rows.map((row) => Number(row.shipments));
}

async function assertEachShippedOnce(orders) {
  const counts = await shipmentsPerOrder(orders);
  assert.equal(counts.length, orders.length);
  assert.deepEqual(counts.filter((count) => count !== 1), [], 'every order shipped exactly once');
}

const onHand = (sku) => scalar('SELECT on_hand FROM stock WHERE sku = $1', [sku]);
const queued = () => scalar('SELECT count(*) FROM queue');
const consumerBackends = () =>
  scalar("SELECT count(*) FROM pg_stat_activity WHERE application_name = 'inbox-consumer'");
const countReplayed = (lines) => lines.filter((line) => line.replayed).length;

before(async () => {
  db = new Client();
  await db.connect();
  await db.query('TRUNCATE queue');
  await db.query(
    `INSERT INTO stock (sku, on_hand) VALUES ('widget', $1), ('gadget', $1)
     ON CONFLICT (sku) DO NOTHING`, [STOCK]);
  lastOrderId = await scalar('SELECT coalesce(max(order_id), 0) FROM shipments');
});

after(async () => {
  await db.end();
});

test('the same batch delivered twice is applied once', async () => {
  const orders = nextOrders(20);
  const stockBefore = await onHand('widget');
  // The producer retried its publish: every message sits in the queue twice.
  await publish(orders);
  await publish(orders);
  const first = await finished(startConsumer('--batch', '10'));
  assert.equal(first.length, 40);
  assert.equal(countReplayed(first), 20);

  // Later the broker redelivers the whole, already acknowledged, batch.
  await publish(orders);
  const again = await finished(startConsumer('--batch', '10'));
  assert.equal(again.length, 20);
  assert.equal(countReplayed(again), 20);

  await assertEachShippedOnce(orders);
  assert.equal(await onHand('widget'), stockBefore - 20 * 2);
  assert.equal(await queued(), 0);
});

test('a consumer killed (kill -9) mid-batch before its ack: the redelivery is replayed', async () => {
  // The sixth order is for a gadget, whose stock row this test holds locked,
  // so the consumer stops mid-batch exactly there.
  const orders = nextOrders(30, (i) => (i === 5 ? 'gadget' : 'widget'));
  const stockBefore = await onHand('widget');
  await publish(orders);

  const locker = new Client();
  await locker.connect();
  await locker.query('BEGIN');
  await locker.query("SELECT FROM stock WHERE sku = 'gadget' FOR UPDATE");
  const doomed = startConsumer('--batch', '30');
  await waitFor(() => doomed.lines.length >= 5, 'five messages applied');
  await waitFor(async () => (await scalar(
    `SELECT count(*) FROM pg_stat_activity
      WHERE application_name = 'inbox-consumer' AND wait_event_type = 'Lock'`)) === 1,
  'the consumer to block on the sixth message');
  assert.equal(doomed.lines.length, 5);
  doomed.child.kill('SIGKILL');
  await doomed.exited;
  await locker.query('ROLLBACK');
  await locker.end();
  await waitFor(async () => (await consumerBackends()) === 0, 'the dead consumer\'s sessions to end');

  // Five effects committed, nothing was acknowledged.
  assert.equal((await shipmentsPerOrder(orders)).filter((count) => count > 0).length, 5);
  assert.equal(await queued(), 30);

  const restarted = await finished(startConsumer('--batch', '30'));
  assert.equal(restarted.length, 30);
  assert.deepEqual(
    restarted.filter((line) => line.replayed).map((line) => line.message_id),
    doomed.lines.map((line) => line.message_id),
    'exactly the messages applied before the kill are replayed');
  await assertEachShippedOnce(orders);
  assert.equal(await onHand('widget'), stockBefore - 29 * 2);
  assert.equal(await queued(), 0);
});

test('a rebalance replaying 500 messages to two consumers applies each once', async () => {
  const orders = nextOrders(500);
  const stockBefore = await onHand('widget');
  await publish(orders);
  const consumers = [startConsumer('--batch', '25'), startConsumer('--batch', '25')];
  const processed = () => consumers.reduce((sum, consumer) => sum + consumer.lines.length, 0);
  await waitFor(() => processed() >= 100, 'the first 100 messages');
  // The group rebalanced and the broker replays all 500 from the last
  // committed offset, while the consumers are still working.
  await publish(orders);

  const lines = (await Promise.all(consumers.map(finished))).flat();
  assert.equal(lines.length, 1000);
  assert.equal(countReplayed(lines), 500);
  assert.equal(new Set(lines.filter((line) => !line.replayed).map((line) => line.message_id)).size, 500);
  await assertEachShippedOnce(orders);
  assert.equal(await onHand('widget'), stockBefore - 500 * 2);
  assert.equal(await queued(), 0);
});
