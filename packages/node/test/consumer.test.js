'use strict';
// consume() against a real database and a recording stand-in for an amqplib
// channel: the ack comes after the commit, a redelivery replays, IK409
// requeues, IK422 and poison messages are dead-lettered with a reason, a
// stored error is replied. (examples/rabbitmq runs the same code against a
// real RabbitMQ node, with crashes, in test/run-all's broker suite.)

const { test, before, after } = require('node:test');
const assert = require('node:assert/strict');
const { randomUUID, createHash } = require('node:crypto');
const { consume, claim } = require('..');
const { createPool, waitFor, shortTtlPool, waitUntilGone } = require('./helpers');

let pool;
let observer; // another connection, to see what is committed

before(async () => {
  pool = createPool(6);
  observer = createPool(1);
  await pool.query('CREATE TABLE IF NOT EXISTS consumer_effects (message_id text NOT NULL, amount int NOT NULL)');
});
after(async () => {
  await pool.end();
  await observer.end();
});

const effects = async (id) => (await observer.query(
  'SELECT count(*)::int AS n FROM consumer_effects WHERE message_id = $1', [id])).rows[0].n;

// Records what the consumer does with the channel, in order.
function fakeChannel({ confirms = true } = {}) {
  const channel = {
    log: [],
    closed: false,
    onMessage: null,
    async consume(queue, onMessage, options) {
      assert.equal(options.noAck, false);
      channel.onMessage = onMessage;
      return { consumerTag: 'tag-1' };
    },
    async cancel() {},
    check() {
      if (channel.closed) throw new Error('Channel closed');
    },
    ack(message) { channel.check(); channel.log.push({ op: 'ack', id: message.properties.messageId, at: channel.onAck?.(message) }); },
    nack(message, allUpTo, requeue) { channel.check(); channel.log.push({ op: 'nack', id: message.properties.messageId, requeue }); },
    publish(exchange, routingKey, content, options) {
      channel.check();
      channel.log.push({ op: 'publish', exchange, routingKey, content: content.toString(), options });
      return true;
    },
    sendToQueue(queue, content, options) {
      channel.check();
      channel.log.push({ op: 'reply', queue, body: JSON.parse(content.toString()), bytes: content.toString(), options });
      return true;
    },
  };
  if (confirms)
    channel.waitForConfirms = async () => { channel.log.push({ op: 'confirmed' }); };
  return channel;
}

let tag = 0;
function message(id, payload, properties = {}) {
  return {
    content: Buffer.from(JSON.stringify(payload)),
    fields: { deliveryTag: ++tag, redelivered: false },
    properties: { messageId: id, headers: {}, deliveryMode: 2, ...properties },
  };
}

async function start(channel, options = {}) {
  const events = [];
  await consume({
    channel, queue: 'jobs', pool,
    deadLetter: { exchange: '', routingKey: 'jobs.dead' },
    backoff: () => 5,
    maxAttempts: 3,
    onEvent: (event) => events.push(event),
    handler: async (db, payload, delivery) => {
      await db.query('INSERT INTO consumer_effects VALUES ($1, $2)', [delivery.properties.messageId, payload.amount]);
      if (payload.refuse) {
        const error = new Error('insufficient funds');
        error.code = 'P0001';
        throw error;
      }
      if (payload.fail)
        throw new Error('cannot apply');
      if (payload.serialization) {
        const error = new Error('could not serialize access');
        error.code = '40001';
        throw error;
      }
      return { applied: delivery.properties.messageId, amount: payload.amount, at: Date.now() };
    },
    ...options,
  });
  const deliver = async (delivery) => {
    const settledBefore = events.filter((e) => ['acked', 'dead-lettered', 'requeued', 'retried', 'error'].includes(e.type)).length;
    channel.onMessage(delivery);
    await waitFor(() => events.filter((e) => ['acked', 'dead-lettered', 'requeued', 'retried', 'error']
      .includes(e.type)).length > settledBefore, 'the delivery to settle');
  };
  return { events, deliver };
}

test('the ack comes after the commit; a redelivery replays the stored answer and is acked', async () => {
  const channel = fakeChannel();
  channel.onAck = (delivery) => effects(delivery.properties.messageId); // a promise: checked below
  const { events, deliver } = await start(channel);
  const id = randomUUID();
  const first = message(id, { amount: 5 }, { replyTo: 'replies', correlationId: `c-${id}` });
  await deliver(first);
  await deliver({ ...first, fields: { deliveryTag: ++tag, redelivered: true } });
  assert.equal(await effects(id), 1, 'the effect applied once');
  const acks = channel.log.filter((entry) => entry.op === 'ack');
  assert.equal(acks.length, 2);
  for (const ack of acks)
    assert.equal(await ack.at, 1, 'at the ack the effect was already committed');
  const replies = channel.log.filter((entry) => entry.op === 'reply');
  assert.equal(replies.length, 2);
  assert.equal(replies[1].bytes, replies[0].bytes, 'the replay replies the stored answer, byte for byte');
  const { rows: [stored] } = await pool.query('SELECT response::text AS text FROM idempotency.lookup($1)', [id]);
  assert.equal(replies[0].bytes, stored.text, 'the reply is the stored answer\'s jsonb text');
  assert.equal(replies[0].options.correlationId, `c-${id}`);
  assert.equal(replies[0].queue, 'replies');
  assert.deepEqual(replies.map((r) => r.options.headers['x-idempotency-replayed']), [false, true]);
  // the reply is confirmed before the ack
  const order = channel.log.map((entry) => entry.op);
  assert.deepEqual(order, ['reply', 'confirmed', 'ack', 'reply', 'confirmed', 'ack']);
  assert.deepEqual(events.filter((e) => e.type === 'acked').map((e) => e.outcome), ['ran', 'replayed']);
});

test('IK422: the same id with another payload is dead-lettered with the reason, and acked', async () => {
  const channel = fakeChannel();
  const { deliver } = await start(channel);
  const id = randomUUID();
  await deliver(message(id, { amount: 1 }));
  await deliver(message(id, { amount: 2 }));
  assert.equal(await effects(id), 1);
  const dead = channel.log.find((entry) => entry.op === 'publish');
  assert.equal(dead.routingKey, 'jobs.dead');
  assert.equal(dead.options.headers['x-idempotency-code'], 'IK422');
  assert.match(dead.options.headers['x-idempotency-reason'], /.+/);
  assert.equal(dead.options.messageId, id);
  assert.equal(dead.options.persistent, true);
  assert.equal(JSON.parse(dead.content).amount, 2);
  assert.deepEqual(channel.log.slice(-3).map((entry) => entry.op), ['publish', 'confirmed', 'ack']);
});

test('IK422 without a dead-letter destination: rejected without requeue', async () => {
  const channel = fakeChannel();
  const { deliver } = await start(channel, { deadLetter: undefined });
  const id = randomUUID();
  await deliver(message(id, { amount: 1 }));
  await deliver(message(id, { amount: 2 }));
  assert.deepEqual(channel.log.at(-1), { op: 'nack', id, requeue: false });
});

test('IK410: a message that ran and whose answer expired is acked without running or a reply; another payload is IK422', async () => {
  const channel = fakeChannel();
  const { events, deliver } = await start(channel, { pool: shortTtlPool(pool) });
  const id = randomUUID();
  const first = message(id, { amount: 4 }, { replyTo: 'replies', correlationId: id });
  await deliver(first);
  await waitUntilGone(observer, id);
  channel.log.length = 0;
  await deliver({ ...first, fields: { deliveryTag: ++tag, redelivered: true } });
  assert.deepEqual(channel.log.map((entry) => entry.op), ['ack'], 'acked, nothing replied or requeued');
  assert.deepEqual(events.filter((e) => e.type === 'acked').map((e) => [e.key, e.outcome]), [[id, 'ran'], [id, 'gone']]);
  assert.equal(await effects(id), 1, 'the handler did not run again');
  await deliver(message(id, { amount: 5 }));
  assert.equal(channel.log.find((entry) => entry.op === 'publish').options.headers['x-idempotency-code'], 'IK422');
  assert.equal(await effects(id), 1);
});

test('IK409: a key held by another transaction is requeued after the backoff, not applied', async () => {
  const channel = fakeChannel();
  const { events, deliver } = await start(channel);
  const id = randomUUID();
  const holder = await pool.connect();
  try {
    await holder.query('BEGIN');
    await claim(holder, id, null);
    await deliver(message(id, { amount: 1 }));
    assert.deepEqual(channel.log.at(-1), { op: 'nack', id, requeue: true });
    assert.equal(events.find((e) => e.type === 'requeued').attempts, 1);
  } finally {
    await holder.query('ROLLBACK');
    holder.release();
  }
  assert.equal(await effects(id), 0);
});

test('a stored error is the answer: work undone, replied, acked, and replayed without running again', async () => {
  const channel = fakeChannel();
  const { events, deliver } = await start(channel, { isStoredError: (error) => error.code === 'P0001' });
  const id = randomUUID();
  const refused = message(id, { amount: 7, refuse: true }, { replyTo: 'replies', correlationId: id });
  await deliver(refused);
  await deliver({ ...refused, fields: { deliveryTag: ++tag, redelivered: true } });
  assert.equal(await effects(id), 0, 'the handler\'s insert was rolled back');
  const replies = channel.log.filter((entry) => entry.op === 'reply').map((entry) => entry.body);
  assert.deepEqual(replies[0], { error: { sqlstate: 'P0001', message: 'insufficient funds', detail: null, hint: null } });
  assert.deepEqual(replies[1], replies[0]);
  assert.deepEqual(events.filter((e) => e.type === 'acked').map((e) => e.outcome), ['stored_error', 'replayed_error']);
});

test('a stored error is stored under a new claim after ROLLBACK: an answer another delivery committed in between is replayed', async () => {
  const channel = fakeChannel();
  const id = randomUUID();
  const refused = message(id, { amount: 7, refuse: true });
  const sent = [];
  // After the consumer's ROLLBACK, another delivery of the key runs and commits.
  const racing = {
    connect: async () => {
      const client = await recordingPool(pool, sent).connect();
      const { query } = client;
      client.query = async function afterRollback(...args) {
        const result = await query.apply(this, args);
        if (args[0] === 'ROLLBACK' && sent.filter((text) => text === 'ROLLBACK').length === 1) {
          const other = await observer.connect();
          try {
            await other.query('BEGIN');
            await claim(other, id, createHash('sha256').update(refused.content).digest('hex'));
            await other.query('INSERT INTO consumer_effects VALUES ($1, 1)', [id]);
            await other.query('SELECT idempotency.complete($1, \'{"other": true}\')', [id]);
            await other.query('COMMIT');
          } finally {
            other.release();
          }
        }
        return result;
      };
      return client;
    },
  };
  const { events, deliver } = await start(channel, { pool: racing, isStoredError: (error) => error.code === 'P0001' });
  await deliver(refused);
  assert.deepEqual(events.filter((e) => e.type === 'committed').map((e) => [e.outcome, e.response]),
    [['replayed', { other: true }]]);
  assert.equal(await effects(id), 1, 'only the other delivery\'s work');
});

test('a poison message is retried with its attempts counted, then dead-lettered with the last error', async () => {
  const channel = fakeChannel();
  const { deliver } = await start(channel);
  const id = randomUUID();
  await deliver(message(id, { amount: 1, fail: true }));
  const retry = channel.log.find((entry) => entry.op === 'publish');
  assert.equal(retry.routingKey, 'jobs');
  assert.equal(retry.options.headers['x-idempotency-attempts'], 1);
  assert.equal(channel.log.at(-1).op, 'ack');
  channel.log.length = 0;
  await deliver(message(id, { amount: 1, fail: true }, { headers: { 'x-idempotency-attempts': 2 } }));
  const dead = channel.log.find((entry) => entry.op === 'publish');
  assert.equal(dead.routingKey, 'jobs.dead');
  assert.equal(dead.options.headers['x-idempotency-code'], 'handler-error');
  assert.match(dead.options.headers['x-idempotency-reason'], /failed 3 times.*cannot apply/);
  assert.equal(await effects(id), 0);
});

test('a closed channel after the commit: the failure is reported, the effect stays committed once', async () => {
  const channel = fakeChannel();
  const { events, deliver } = await start(channel);
  const id = randomUUID();
  channel.onAck = () => {};
  const delivery = message(id, { amount: 3 });
  channel.closed = true;
  await deliver(delivery);
  assert.ok(events.some((e) => e.type === 'committed'));
  assert.match(String(events.find((e) => e.type === 'error').error.message), /Channel closed/);
  channel.closed = false;
  await deliver({ ...delivery, fields: { deliveryTag: ++tag, redelivered: true } }); // the broker's redelivery
  assert.equal(await effects(id), 1);
  assert.equal(events.filter((e) => e.type === 'acked').at(-1).outcome, 'replayed');
});

test('a message without a key or with a body that is not JSON is dead-lettered with the reason', async () => {
  const channel = fakeChannel();
  const { deliver } = await start(channel);
  await deliver(message(undefined, { amount: 1 }));
  await deliver({ ...message(randomUUID(), {}), content: Buffer.from('{not json') });
  const codes = channel.log.filter((entry) => entry.op === 'publish').map((entry) => entry.options.headers['x-idempotency-code']);
  assert.deepEqual(codes, ['no-key', 'unparsable']);
});

test('a key no claim accepts (over 255 bytes, a NUL character) is dead-lettered as invalid-key, never requeued', async () => {
  const channel = fakeChannel();
  const { events, deliver } = await start(channel);
  const longest = randomUUID().padEnd(255, 'k');
  const bad = ['k'.repeat(256), '\u00e9'.repeat(128), `a\u0000${randomUUID()}`]; // 256 bytes, 256 bytes as UTF-8, a NUL
  for (const id of bad)
    await deliver(message(id, { amount: 1 }));
  await deliver(message(longest, { amount: 1 }));
  const codes = channel.log.filter((entry) => entry.op === 'publish').map((entry) => entry.options.headers['x-idempotency-code']);
  assert.deepEqual(codes, ['invalid-key', 'invalid-key', 'invalid-key']);
  assert.equal(channel.log.filter((entry) => entry.op === 'nack').length, 0, 'nothing requeued');
  assert.equal((await observer.query('SELECT count(*)::int AS n FROM consumer_effects WHERE message_id = ANY($1)',
    [bad.map((id) => id.replace('\u0000', ''))])).rows[0].n, 0, 'no handler ran for them');
  assert.deepEqual(events.filter((e) => e.type === 'acked').map((e) => [e.key, e.outcome]), [[longest, 'ran']],
    'a key of 255 bytes runs');
});

test('a wait timeout the server refuses requeues the message: it is not an invalid key', async () => {
  const channel = fakeChannel();
  const { events, deliver } = await start(channel, { waitTimeout: 'forever' });
  const id = randomUUID();
  await deliver(message(id, { amount: 1 }));
  assert.equal(await effects(id), 0);
  assert.deepEqual(channel.log.map((entry) => entry.op), ['nack']);
  assert.equal(events.find((e) => e.type === 'requeued').error.code, '22023');
});

// A pool whose clients record the text of every statement message they send.
function recordingPool(target, sent) {
  return {
    connect: async () => {
      const client = await target.connect();
      const { query, release } = client;
      client.query = function recorded(...args) {
        sent.push(typeof args[0] === 'string' ? args[0] : args[0].text);
        return query.apply(this, args);
      };
      client.release = (...args) => {
        Object.assign(client, { query, release });
        return release.apply(client, args);
      };
      return client;
    },
  };
}

test('a new message costs a plain consumer\'s round trips: BEGIN with the claim, the handler, complete with COMMIT', async () => {
  const channel = fakeChannel();
  const sent = [];
  const { deliver } = await start(channel, { pool: recordingPool(pool, sent), isStoredError: (error) => error.code === 'P0001' });
  const id = randomUUID();
  await deliver(message(id, { amount: 2 }));
  assert.equal(sent.length, 3, sent.join('\n'));
  assert.match(sent[0], /^BEGIN; SELECT idempotency\.claim\([^;]*\) AS claimed$/);
  assert.match(sent[1], /INSERT INTO consumer_effects/);
  assert.match(sent[2], /idempotency\.complete\(.*; COMMIT$/);
  sent.length = 0;
  await deliver({ ...message(id, { amount: 2 }), fields: { deliveryTag: ++tag, redelivered: true } });
  assert.equal(sent.length, 2, 'a replay: BEGIN with the claim, then COMMIT');
  assert.equal(await effects(id), 1);
});

test('a key and a response with quotes and backslashes go through the literals unchanged', async () => {
  const channel = fakeChannel();
  const id = `it's a \\ key \u00e9 ${randomUUID()}`;
  const { events, deliver } = await start(channel, { handler: async () => ({ text: 'O\'Brien \\ "quoted" \u00e9' }) });
  await deliver(message(id, { amount: 1 }));
  await deliver({ ...message(id, { amount: 1 }), fields: { deliveryTag: ++tag, redelivered: true } });
  const acked = events.filter((e) => e.type === 'acked');
  assert.deepEqual(acked.map((e) => e.outcome), ['ran', 'replayed']);
  const stored = (await observer.query('SELECT response FROM idempotency.keys WHERE key = $1', [id])).rows;
  assert.deepEqual(stored, [{ response: { text: 'O\'Brien \\ "quoted" \u00e9' } }]);
});

test('a business id from the payload is the key', async () => {
  const channel = fakeChannel();
  const { events, deliver } = await start(channel, { key: (delivery, payload) => `order-${payload.order}` });
  const order = randomUUID();
  const ids = [randomUUID(), randomUUID()];
  await deliver(message(ids[0], { amount: 1, order }));
  await deliver(message(ids[1], { amount: 1, order })); // another message id, the same order
  assert.equal(await effects(ids[0]) + await effects(ids[1]), 1, 'the order applied once');
  assert.deepEqual(events.filter((e) => e.type === 'acked').map((e) => [e.key, e.outcome]),
    [[`order-${order}`, 'ran'], [`order-${order}`, 'replayed']]);
});

test('a transient database error in the handler requeues the message without counting an attempt', async () => {
  const channel = fakeChannel();
  const { deliver } = await start(channel);
  const id = randomUUID();
  await deliver(message(id, { amount: 1, serialization: true }));
  assert.deepEqual(channel.log, [{ op: 'nack', id, requeue: true }]);
  assert.equal(await effects(id), 0);
});

// Batch mode: the deliveries of one batch, settled together.
async function startBatch(channel, options = {}) {
  const started = await start(channel, { batchSize: 4, batchWaitMs: 20, ...options });
  const settledCount = () => started.events.filter((e) => ['acked', 'dead-lettered', 'requeued', 'retried', 'error']
    .includes(e.type)).length;
  const deliverBatch = async (deliveries) => {
    const before = settledCount();
    for (const delivery of deliveries)
      channel.onMessage(delivery);
    await waitFor(() => settledCount() >= before + deliveries.length, 'the batch to settle');
  };
  return { ...started, deliverBatch };
}

const writers = async (ids) => (await observer.query(
  'SELECT count(DISTINCT xmin::text)::int AS n FROM consumer_effects WHERE message_id = ANY($1)', [ids])).rows[0].n;

test('batch: one transaction for the batch, acks after its commit; the batch redelivered replays every message', async () => {
  const channel = fakeChannel();
  channel.prefetch = async (count) => { channel.log.push({ op: 'prefetch', count }); };
  channel.onAck = (delivery) => effects(delivery.properties.messageId);
  const { events, deliverBatch } = await startBatch(channel);
  assert.deepEqual(channel.log.shift(), { op: 'prefetch', count: 8 }, 'the next batch gathers while one commits');
  const ids = [randomUUID(), randomUUID(), randomUUID(), randomUUID()];
  const batch = ids.map((id, n) => message(id, { amount: n + 1 }, { replyTo: 'replies', correlationId: id }));
  await deliverBatch(batch);
  for (const id of ids)
    assert.equal(await effects(id), 1);
  assert.equal(await writers(ids), 1, 'one transaction wrote the whole batch');
  const committing = events.findIndex((e) => e.type === 'committed');
  assert.equal(events.slice(0, committing).filter((e) => e.type === 'committing').length, 4,
    'every message of the batch reaches the commit before any is settled');
  const acks = channel.log.filter((entry) => entry.op === 'ack');
  assert.equal(acks.length, 4);
  for (const ack of acks)
    assert.equal(await ack.at, 1, 'at the ack the effect was already committed');
  assert.deepEqual(channel.log.map((entry) => entry.op), ['reply', 'reply', 'reply', 'reply', 'confirmed', 'ack', 'ack', 'ack', 'ack'],
    'the batch\'s replies are published, confirmed by one wait, and only then acked');
  const firstReplies = channel.log.filter((entry) => entry.op === 'reply').map((entry) => entry.bytes);

  channel.log.length = 0;
  await deliverBatch(batch.map((delivery) => ({ ...delivery, fields: { deliveryTag: ++tag, redelivered: true } })));
  for (const id of ids)
    assert.equal(await effects(id), 1, 'a redelivered batch does not run again');
  assert.deepEqual(events.filter((e) => e.type === 'acked').map((e) => e.outcome),
    ['ran', 'ran', 'ran', 'ran', 'replayed', 'replayed', 'replayed', 'replayed']);
  const replies = channel.log.filter((entry) => entry.op === 'reply');
  assert.deepEqual(replies.map((entry) => entry.bytes).sort(), [...firstReplies].sort(),
    'every replay replies its message\'s stored answer, byte for byte');
  assert.ok(replies.every((entry) => entry.options.headers['x-idempotency-replayed'] === true));
});

test('batch: a failing handler is settled alone (retried); the rest of its batch commits once, without its writes', async () => {
  const channel = fakeChannel();
  const { events, deliverBatch } = await startBatch(channel);
  const ids = [randomUUID(), randomUUID(), randomUUID()];
  await deliverBatch([message(ids[0], { amount: 1 }), message(ids[1], { amount: 2, fail: true }),
    message(ids[2], { amount: 3 })]);
  assert.deepEqual([await effects(ids[0]), await effects(ids[1]), await effects(ids[2])], [1, 0, 1]);
  assert.equal(await writers([ids[0], ids[2]]), 1);
  const retry = channel.log.find((entry) => entry.op === 'publish');
  assert.equal(retry.routingKey, 'jobs');
  assert.equal(retry.options.messageId, ids[1]);
  assert.equal(retry.options.headers['x-idempotency-attempts'], 1);
  assert.deepEqual(events.filter((e) => e.type === 'acked').map((e) => [e.message.properties.messageId, e.outcome]).sort(),
    [[ids[0], 'ran'], [ids[1], undefined], [ids[2], 'ran']].filter(([, o]) => o).sort());
  assert.equal(channel.log.filter((entry) => entry.op === 'ack').length, 3, 'the retried delivery is acked after its copy');
});

test('batch: a stored error is its message\'s answer while the others commit; a transient error requeues only its message', async () => {
  const channel = fakeChannel();
  const { events, deliverBatch } = await startBatch(channel, { isStoredError: (error) => error.code === 'P0001' });
  const ids = [randomUUID(), randomUUID(), randomUUID(), randomUUID()];
  await deliverBatch([message(ids[0], { amount: 1 }), message(ids[1], { amount: 2, refuse: true }),
    message(ids[2], { amount: 3, serialization: true }), message(ids[3], { amount: 4 })]);
  assert.deepEqual([await effects(ids[0]), await effects(ids[1]), await effects(ids[2]), await effects(ids[3])],
    [1, 0, 0, 1]);
  const outcomes = Object.fromEntries(events.filter((e) => e.type === 'acked')
    .map((e) => [e.message.properties.messageId, e.outcome]));
  assert.deepEqual(outcomes, { [ids[0]]: 'ran', [ids[1]]: 'stored_error', [ids[3]]: 'ran' });
  assert.deepEqual(channel.log.filter((entry) => entry.op === 'nack'), [{ op: 'nack', id: ids[2], requeue: true }]);
  const { rows: [stored] } = await pool.query('SELECT response FROM idempotency.lookup($1)', [ids[1]]);
  assert.equal(stored.response.error.sqlstate, 'P0001');
});

test('batch: IK409, IK422, a key twice and a poison message are each settled as alone; the others commit', async () => {
  const channel = fakeChannel();
  const { events, deliverBatch } = await startBatch(channel, { batchSize: 6 });
  const [held, reused, twice, fine] = [randomUUID(), randomUUID(), randomUUID(), randomUUID()];
  await deliverBatch([message(reused, { amount: 1 })]);
  const holder = await pool.connect();
  try {
    await holder.query('BEGIN');
    await claim(holder, held, null);
    await deliverBatch([
      message(held, { amount: 1 }), message(reused, { amount: 2 }), message(twice, { amount: 3 }),
      message(twice, { amount: 3 }), { ...message(randomUUID(), {}), content: Buffer.from('{not json') },
      message(fine, { amount: 4 }),
    ]);
  } finally {
    await holder.query('ROLLBACK');
    holder.release();
  }
  assert.deepEqual([await effects(held), await effects(reused), await effects(twice), await effects(fine)], [0, 1, 1, 1]);
  const requeued = events.filter((e) => e.type === 'requeued').map((e) => [e.key, e.error.code]).sort();
  assert.deepEqual(requeued, [[held, 'IK409'], [twice, 'IK508']].sort(),
    'a held key, and a key\'s second delivery in the same batch, come back later');
  const dead = channel.log.filter((entry) => entry.op === 'publish').map((entry) => entry.options.headers['x-idempotency-code']);
  assert.deepEqual(dead.sort(), ['IK422', 'unparsable']);
  assert.equal(events.filter((e) => e.type === 'acked' && e.outcome === 'ran').length, 3);
});

test('batch: a message that ran and whose answer expired (IK410) is acked without running; the rest of its batch runs', async () => {
  const channel = fakeChannel();
  const { events, deliverBatch } = await startBatch(channel, { pool: shortTtlPool(pool) });
  const [gone, fresh] = [randomUUID(), randomUUID()];
  await deliverBatch([message(gone, { amount: 4 })]);
  await waitUntilGone(observer, gone);
  await deliverBatch([message(gone, { amount: 4 }), message(fresh, { amount: 5 })]);
  assert.deepEqual([await effects(gone), await effects(fresh)], [1, 1], 'the gone message did not run again');
  assert.deepEqual(events.filter((e) => e.type === 'acked').map((e) => [e.key, e.outcome]),
    [[gone, 'ran'], [gone, 'gone'], [fresh, 'ran']]);
  assert.equal(channel.log.filter((entry) => entry.op === 'nack').length, 0, 'nothing requeued');
});

test('batch: a database error outside the handlers (here a wait_timeout the server refuses) ends the whole batch; every delivery is requeued, nothing applied', async () => {
  const channel = fakeChannel();
  const { events, deliverBatch } = await startBatch(channel, { waitTimeout: 'forever' });
  const ids = [randomUUID(), randomUUID()];
  await deliverBatch(ids.map((id) => message(id, { amount: 1 })));
  assert.deepEqual([await effects(ids[0]), await effects(ids[1])], [0, 0]);
  assert.deepEqual(channel.log.map((entry) => entry.op), ['nack', 'nack']);
  assert.equal(events.filter((e) => e.type === 'requeued').length, 2);
});

test('batch: a batch costs a round trip per handler and two more: BEGIN with claim_batch, complete_batch with COMMIT', async () => {
  const channel = fakeChannel();
  const sent = [];
  const { events, deliverBatch } = await startBatch(channel, { pool: recordingPool(pool, sent) });
  const ids = [1, 2, 3, 4].map(() => `it's a \\ key ${randomUUID()}`);
  await deliverBatch(ids.map((id) => message(id, { amount: 1 })));
  assert.equal(sent.length, 6, sent.join('\n'));
  assert.match(sent[0], /^BEGIN; SELECT .* FROM idempotency\.claim_batch\(/);
  assert.match(sent[5], /^SELECT idempotency\.complete_batch\(.*; COMMIT$/);
  assert.deepEqual(await Promise.all(ids.map(effects)), [1, 1, 1, 1]);
  sent.length = 0;
  await deliverBatch(ids.map((id) => ({ ...message(id, { amount: 1 }), fields: { deliveryTag: ++tag, redelivered: true } })));
  assert.equal(sent.length, 2, `replays: BEGIN with claim_batch, then complete_batch with COMMIT: ${sent.join('\n')}`);
  assert.deepEqual(events.filter((e) => e.type === 'acked').map((e) => e.outcome), [...Array(4).fill('ran'), ...Array(4).fill('replayed')]);
  assert.deepEqual(await Promise.all(ids.map(effects)), [1, 1, 1, 1]);
});

test('batch: a key no claim accepts is dead-lettered alone; the rest of its batch commits', async () => {
  const channel = fakeChannel();
  const { events, deliverBatch } = await startBatch(channel);
  const ids = [randomUUID(), 'k'.repeat(256), randomUUID()];
  await deliverBatch(ids.map((id) => message(id, { amount: 1 })));
  assert.deepEqual([await effects(ids[0]), await effects(ids[2])], [1, 1]);
  assert.deepEqual(events.filter((e) => e.type === 'dead-lettered').map((e) => e.code ?? e.reason), ['invalid-key']);
  assert.equal(channel.log.filter((entry) => entry.op === 'nack').length, 0, 'nothing requeued');
});

test('batch: batchSize must be a whole number >= 1', async () => {
  await assert.rejects(consume({ channel: fakeChannel(), queue: 'q', pool, handler: () => 1, batchSize: 0 }), RangeError);
  await assert.rejects(consume({ channel: fakeChannel(), queue: 'q', pool, handler: () => 1, batchSize: 2.5 }), RangeError);
});
