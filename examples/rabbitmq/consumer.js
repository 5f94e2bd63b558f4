'use strict';
// A competing consumer of the `transfers` queue: each message is applied
// once through idempotency-pg's consume() (claim, apply, store the answer,
// COMMIT, then ack), with manual acks and a prefetch.
//
//   AMQP_URL=amqp://... PGHOST=... PGDATABASE=... PGUSER=... node consumer.js [--plain|--textbook] [--prefetch N] [--batch N]
//
// --plain:    the same consumer without the extension (apply, COMMIT, reply,
//             ack), for the benchmark only: a redelivery applies a message again.
// --textbook: the textbook inbox instead of the extension: the message id
//             inserted into public.processed_messages with ON CONFLICT DO
//             NOTHING in the work's transaction; a message whose id is there
//             already is acked without its work and without a reply (no
//             answer is kept). What it lacks: a stored answer to reply to a
//             redelivery, a check that a reused id carries the same payload,
//             expiry of the ids.
// --batch N (or STORM_BATCH=N): batch mode, N messages per transaction
//          (consume()'s batchSize; with --plain or --textbook, N applied in
//          one transaction, then replied and acked), with a prefetch of 2N.
// Prints one JSON line per event to stdout (written synchronously, so a line
// is out before a SIGKILL that follows it). Exits 0 on SIGTERM once the
// deliveries in flight are settled, 3 when the broker connection is lost.
//
// For the fault storm (test/broker/storm.js) only:
//   STORM_KILL_POINT=before-processing|in-transaction|after-commit
//   STORM_KILL_AT=n          SIGKILL itself at the n-th delivery reaching the point
//   STORM_CLOSE_CHANNEL_AT=n close the channel at the n-th delivery or the first after it
//                            that has others in flight

const fs = require('node:fs');
const amqp = require('amqplib');
const { Pool } = require('pg');
const { consume } = require('idempotency-pg');
const { QUEUE, DEAD_LETTERS, declareTopology } = require('./topology');

const args = process.argv.slice(2);
const plain = args.includes('--plain');
const textbook = args.includes('--textbook');
const prefetchAt = args.indexOf('--prefetch');
const batchAt = args.indexOf('--batch');
const batch = batchAt >= 0 ? Number(args[batchAt + 1]) : Number(process.env.STORM_BATCH || 1);
const prefetch = prefetchAt >= 0 ? Number(args[prefetchAt + 1]) : (batch > 1 ? 2 * batch : 16);
const killPoint = process.env.STORM_KILL_POINT || null;
const killAt = Number(process.env.STORM_KILL_AT || 0);
const closeChannelAt = Number(process.env.STORM_CLOSE_CHANNEL_AT || 0);

const log = (line) => fs.writeSync(1, `${JSON.stringify({ pid: process.pid, t: Date.now(), ...line })}\n`);

let reached = 0; // deliveries that reached the kill point
function maybeKill(point, messageId) {
  if (point !== killPoint || ++reached !== killAt)
    return;
  log({ event: 'kill', point, id: messageId });
  process.kill(process.pid, 'SIGKILL');
}

const applyTransfer = async (db, payload, messageId) => {
  if (payload.poison)
    throw new Error(`message ${messageId} cannot be applied: ${payload.poison}`);
  const { rows: [row] } = await db.query('SELECT public.apply_transfer($1, $2, $3) AS answer',
    [messageId, payload.account, payload.amount]);
  return row.answer;
};

async function main() {
  const pool = new Pool({ max: prefetch + 1 });
  pool.on('error', () => {});
  const connection = await amqp.connect(process.env.AMQP_URL);
  connection.on('error', () => {});
  connection.on('close', () => { log({ event: 'connection-closed' }); process.exit(3); });
  const channel = await connection.createConfirmChannel();
  channel.on('error', () => {});
  await declareTopology(channel);
  await channel.prefetch(prefetch);

  let inFlight = 0;
  let deliveries = 0;
  let stopping = false;
  let channelClosed = false;
  const settled = () => {
    inFlight--;
    if (stopping && inFlight === 0)
      finish();
  };
  async function finish() {
    log({ event: 'stopped' });
    await connection.close().catch(() => {});
    process.exit(0);
  }
  channel.on('close', () => {
    if (channelClosed) // the storm's own close: let the deliveries in flight settle, then leave
      stopping = true;
  });

  function delivered(message) {
    inFlight++;
    deliveries++;
    const id = message.properties.messageId;
    maybeKill('before-processing', id);
    // From the n-th delivery on, at the first with another delivery in
    // flight: a close with nothing else in flight would prove nothing.
    if (closeChannelAt && deliveries >= closeChannelAt && inFlight > 1 && !channelClosed) {
      channelClosed = true;
      log({ event: 'channel-close', id, in_flight: inFlight });
      channel.close().catch(() => {}).finally(() => { if (inFlight === 0) finish(); });
    }
  }

  // The textbook inbox: the ids of messages that are not in
  // public.processed_messages yet, inserted now in the caller's transaction
  // (a concurrent transaction inserting one of them makes this wait for its
  // COMMIT or ROLLBACK).
  async function firstSeen(client, ids) {
    const { rows } = await client.query('INSERT INTO public.processed_messages (message_id) SELECT unnest($1::text[])'
      + ' ON CONFLICT DO NOTHING RETURNING message_id', [ids]);
    return new Set(rows.map((row) => row.message_id));
  }

  // A failed transaction of the consumers without the extension: its
  // messages are requeued when the database's error is transient (a
  // deadlock, a lost connection), else dead-lettered (the benchmark
  // publishes none that fails).
  function settleFailed(messages, error) {
    const requeue = /^(08|40|53|57|58)/.test(error.code ?? '');
    for (const message of messages) {
      channel.nack(message, false, requeue);
      log({ event: requeue ? 'requeued' : 'dead-lettered', id: message.properties.messageId, code: error.code,
        reason: error.message });
    }
  }

  // Without the extension, a batch: the messages applied in one transaction
  // (with --textbook, those whose id is new, each once), then replied
  // (confirmed) and acked.
  async function applyPlainBatch(messages) {
    const client = await pool.connect();
    try {
      await client.query('BEGIN');
      const ids = messages.map((message) => message.properties.messageId);
      const fresh = textbook ? await firstSeen(client, ids) : null;
      const answers = [];
      for (const message of messages) {
        const id = message.properties.messageId;
        const isNew = !textbook || fresh.delete(id); // a second copy in the batch is a duplicate too
        answers.push(isNew ? await applyTransfer(client, JSON.parse(message.content), id) : undefined);
      }
      await client.query('COMMIT');
      for (const id of ids)
        maybeKill('after-commit', id);
      for (const [n, message] of messages.entries())
        if (message.properties.replyTo && answers[n] !== undefined)
          channel.sendToQueue(message.properties.replyTo, Buffer.from(JSON.stringify(answers[n])),
            { correlationId: message.properties.correlationId, contentType: 'application/json', persistent: true });
      await channel.waitForConfirms();
      for (const [n, message] of messages.entries()) {
        channel.ack(message);
        log({ event: 'acked', id: message.properties.messageId, outcome: answers[n] === undefined ? 'duplicate' : 'ran',
          redelivered: message.fields.redelivered, batch });
      }
    } catch (error) {
      await client.query('ROLLBACK').catch(() => {});
      settleFailed(messages, error);
    } finally {
      client.release();
      for (let n = 0; n < messages.length; n++) settled();
    }
  }

  if ((plain || textbook) && batch > 1) {
    let gathered = [];
    let timer = null;
    let running = Promise.resolve();
    const flush = () => {
      clearTimeout(timer);
      timer = null;
      const messages = gathered;
      gathered = [];
      running = running.then(() => applyPlainBatch(messages));
    };
    await channel.consume(QUEUE, (message) => {
      if (!message) return;
      delivered(message);
      gathered.push(message);
      if (gathered.length >= batch) flush();
      else if (timer === null) timer = setTimeout(flush, 10);
    }, { noAck: false });
  } else if (plain || textbook) {
    await channel.consume(QUEUE, async (message) => {
      if (!message) return;
      delivered(message);
      const id = message.properties.messageId;
      const client = await pool.connect();
      try {
        await client.query('BEGIN');
        if (textbook) {
          const { rowCount } = await client.query(
            'INSERT INTO public.processed_messages (message_id) VALUES ($1) ON CONFLICT DO NOTHING', [id]);
          if (rowCount === 0) { // processed before: acked without its work
            await client.query('COMMIT');
            channel.ack(message);
            log({ event: 'acked', id, outcome: 'duplicate', redelivered: message.fields.redelivered });
            return;
          }
        }
        const answer = await applyTransfer(client, JSON.parse(message.content), id);
        await client.query('COMMIT');
        maybeKill('after-commit', id);
        if (message.properties.replyTo) { // the same reply as consume() sends, confirmed before the ack
          channel.sendToQueue(message.properties.replyTo, Buffer.from(JSON.stringify(answer)),
            { correlationId: message.properties.correlationId, contentType: 'application/json', persistent: true });
          await channel.waitForConfirms();
        }
        channel.ack(message);
        log({ event: 'acked', id, outcome: 'ran', redelivered: message.fields.redelivered });
      } catch (error) {
        await client.query('ROLLBACK').catch(() => {});
        settleFailed([message], error);
      } finally {
        client.release();
        settled();
      }
    }, { noAck: false });
  } else {
    await consume({
      channel, queue: QUEUE, pool, batchSize: batch,
      deadLetter: { exchange: '', routingKey: DEAD_LETTERS },
      isStoredError: (error) => error.code === 'P0001', // refused transfers are answers
      maxAttempts: 3,
      handler: async (db, payload, message) => {
        const answer = await applyTransfer(db, payload, message.properties.messageId);
        maybeKill('in-transaction', message.properties.messageId);
        return answer;
      },
      onEvent: (event) => {
        const id = event.message?.properties.messageId;
        switch (event.type) {
        case 'delivered': delivered(event.message); break;
        case 'committed': // logged in storms only: the plain consumer logs no such line
          if (killPoint !== null)
            log({ event: 'committed', id, outcome: event.outcome });
          maybeKill('after-commit', id);
          break;
        case 'acked':
          log({ event: 'acked', id, outcome: event.outcome, redelivered: event.message.fields.redelivered,
            ...(batch > 1 ? { batch } : {}) });
          settled();
          break;
        case 'dead-lettered':
          log({ event: 'dead-lettered', id, code: event.code, reason: event.reason });
          settled();
          break;
        case 'requeued': case 'retried':
          log({ event: event.type, id, attempts: event.attempts, code: event.error?.code,
            error: String(event.error?.message ?? event.error) });
          settled();
          break;
        case 'error':
          log({ event: 'settle-failed', id, error: String(event.error?.message ?? event.error) });
          settled();
          break;
        default: break;
        }
      },
    });
  }
  log({ event: 'consuming', plain, textbook, prefetch, batch });
  process.on('SIGTERM', () => {
    stopping = true;
    channel.close().catch(() => {}); // unacked deliveries go back to the queue
    if (inFlight === 0)
      finish();
  });
}

main().catch((error) => {
  log({ event: 'failed', error: String(error.stack || error) });
  process.exit(2);
});
