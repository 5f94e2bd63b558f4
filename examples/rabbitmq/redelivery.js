'use strict';
// The textbook inbox's own check (consumer.js and consumer.py with
// --textbook, the benchmark's peer of the extension): a message it
// committed is redelivered, or published twice, and its work is not done
// again. For each consumer, per message and in batches of 8: 200 transfers
// published with confirms, every 20th of them twice; a consumer that
// SIGKILLs itself after the commit of its 50th message, before the ack (so
// the broker redelivers what it had not acked), then a clean one that
// settles the rest. Checks that the kill landed after the commit, that the
// killed message came back redelivered and was acked as a duplicate, that
// the published copies were acked as duplicates, and that every message's
// transfer is in the ledger exactly once. Prints one line per check and
// "textbook checks: N passed, M failed".
//
//   AMQP_URL=... PGHOST=... PGDATABASE=... PGUSER=... node redelivery.js LOGDIR

const fs = require('node:fs');
const path = require('node:path');
const { spawn } = require('node:child_process');
const amqp = require('amqplib');
const { Client } = require('pg');
const { QUEUE, DEAD_LETTERS, REPLIES, declareTopology } = require('./topology');

const logDir = process.argv[2] || fs.mkdtempSync('/tmp/textbook-');
const COUNT = 200;
const KILL_AT = 50;
const deadlineMs = 120000;
const sleep = (ms) => new Promise((resolve) => setTimeout(resolve, ms));
const variants = [
  { language: 'node', batch: 1 }, { language: 'node', batch: 8 },
  { language: 'python', batch: 1 }, { language: 'python', batch: 8 },
];

// Publishes the variant's transfers (ids prefix-0 ...), every 20th twice;
// returns the ids and how many copies were published.
async function publish(url, prefix) {
  const connection = await amqp.connect(url);
  try {
    const channel = await connection.createConfirmChannel();
    await declareTopology(channel);
    for (const queue of [QUEUE, DEAD_LETTERS, REPLIES])
      await channel.purgeQueue(queue);
    const ids = [];
    let copies = 0;
    for (let i = 0; i < COUNT; i++) {
      const id = `${prefix}-${i}`;
      ids.push(id);
      const payload = Buffer.from(JSON.stringify({ account: 1 + (i % 50), amount: 1 + (i % 7) }));
      for (let copy = 0; copy < (i % 20 === 19 ? 2 : 1); copy++, copies++)
        channel.sendToQueue(QUEUE, payload, { messageId: id, correlationId: id, replyTo: REPLIES, persistent: true });
    }
    await channel.waitForConfirms();
    return { ids, copies };
  } finally {
    await connection.close();
  }
}

function spawnConsumer({ language, batch }, file, env) {
  const out = fs.openSync(file, 'w');
  const [command, script] = language === 'python' ? ['/usr/bin/python3', 'consumer.py'] : [process.execPath, 'consumer.js'];
  const child = spawn(command, [path.join(__dirname, script), '--textbook', ...(batch > 1 ? ['--batch', String(batch)] : [])], {
    env: { ...process.env, ...env, PYTHONPATH: path.join(__dirname, '..', '..', 'packages', 'python', 'src') },
    stdio: ['ignore', out, out],
  });
  fs.closeSync(out);
  const exited = new Promise((resolve) => child.on('exit', (code, signal) => resolve({ code, signal })));
  return { child, exited };
}

const readLog = (file) => fs.readFileSync(file, 'utf8').split('\n').filter(Boolean).map((line) => {
  try { return JSON.parse(line); } catch { return { event: 'text', text: line }; }
});

async function runVariant(db, variant, checks) {
  const name = `${variant.language}${variant.batch > 1 ? `, batches of ${variant.batch}` : ', per message'}`;
  const prefix = `${variant.language}-${variant.batch}`;
  const { ids, copies } = await publish(process.env.AMQP_URL, prefix);
  const killedFile = path.join(logDir, `textbook-${prefix}-killed.log`);
  const killed = spawnConsumer(variant, killedFile, { STORM_KILL_POINT: 'after-commit', STORM_KILL_AT: KILL_AT });
  const killedExit = await Promise.race([killed.exited, sleep(deadlineMs).then(() => null)]);
  const kill = readLog(killedFile).find((line) => line.event === 'kill');
  const { rows: [{ committed }] } = await db.query(
    'SELECT count(*)::int AS committed FROM public.processed_messages WHERE message_id = $1', [kill?.id ?? null]);
  checks.push([`${name}: the consumer was killed after the commit of a message, before its ack`,
    killedExit?.signal === 'SIGKILL' && kill !== undefined && committed === 1]);

  const cleanFile = path.join(logDir, `textbook-${prefix}-clean.log`);
  const clean = spawnConsumer(variant, cleanFile, {});
  const started = Date.now();
  let settled = [];
  for (;;) {
    settled = [...readLog(killedFile), ...readLog(cleanFile)]
      .filter((line) => line.event === 'acked' || line.event === 'dead-lettered');
    if (settled.length >= copies || Date.now() - started > deadlineMs) break;
    await sleep(200);
  }
  clean.child.kill('SIGTERM');
  await clean.exited;

  const again = settled.filter((line) => line.id === kill?.id && line.redelivered);
  checks.push([`${name}: the killed message was redelivered and acked as a duplicate, without its work`,
    again.length > 0 && again.every((line) => line.outcome === 'duplicate')]);
  // Each copy acked (one whose ack the kill cut off is delivered and acked
  // again); beyond the first run of an id, the published second copies and
  // the killed message are duplicates at least.
  const duplicates = settled.filter((line) => line.outcome === 'duplicate').length;
  checks.push([`${name}: ${settled.length} acks for ${copies} copies, ${duplicates} of them as duplicates `
    + `(the ${copies - COUNT} published twice and the killed one at least)`,
  settled.length >= copies && duplicates >= copies - COUNT + 1]);
  const { rows } = await db.query(
    'SELECT id, count(l.message_id)::int AS n FROM unnest($1::text[]) id LEFT JOIN public.ledger l ON l.message_id = id'
    + ' GROUP BY id HAVING count(l.message_id) <> 1', [ids]);
  for (const row of rows.slice(0, 10))
    console.log(`textbook: ${row.id} applied ${row.n} times`);
  checks.push([`${name}: no message dead-lettered, each of the ${COUNT} transfers in the ledger once`,
    settled.every((line) => line.event === 'acked') && rows.length === 0]);
}

async function main() {
  const db = new Client();
  await db.connect();
  const checks = [];
  for (const variant of variants)
    await runVariant(db, variant, checks);
  await db.end();
  for (const [name, ok] of checks)
    console.log(`${ok ? 'ok' : 'not ok'} - ${name}`);
  const failed = checks.filter(([, ok]) => !ok).length;
  console.log(`textbook checks: ${checks.length - failed} passed, ${failed} failed`);
  process.exit(failed === 0 ? 0 : 1);
}

main().catch((error) => {
  console.error(error);
  process.exit(1);
});
