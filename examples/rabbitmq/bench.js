'use strict';
// Messages per second of the same consumer with the extension (consume():
// claim, apply, complete, COMMIT, ack) and without it (--plain: apply,
// COMMIT, ack), per message (prefetch 16) and in batches of BENCH_BATCH
// (default 32; one claim_batch, the transfers, one complete_batch, COMMIT,
// then the acks; plain: the transfers, COMMIT, acks; prefetch twice the
// batch): four legs, two runs each, the legs alternating within a run, each
// on a fresh database: BENCH_MESSAGES (default 5000) plain transfers
// published with confirms first, then consumed by BENCH_CONSUMERS (default
// 2) competing consumers. The transfers go to BENCH_ACCOUNTS accounts
// (default: one per message) in turn: with few accounts, concurrent batches
// wait for each other's account rows and deadlock (plain batches are
// dead-lettered whole, the extension's rerun without the message), which
// measures the workload, not the inbox. The rate is the settled deliveries
// over the time from the first ack to the last one, as the consumers logged
// them.
//
//   AMQP_URL=... PGHOST=... PGPORT=... node bench.js LOGDIR

const fs = require('node:fs');
const path = require('node:path');
const { spawn } = require('node:child_process');
const amqp = require('amqplib');
const { Client } = require('pg');
const { publish } = require('./publisher');
const { QUEUE, DEAD_LETTERS, REPLIES, declareTopology } = require('./topology');

const logDir = process.argv[2] || fs.mkdtempSync('/tmp/bench-');
const count = Number(process.env.BENCH_MESSAGES || 5000);
const consumers = Number(process.env.BENCH_CONSUMERS || 2);
const batch = Number(process.env.BENCH_BATCH || 32);
const accounts = Number(process.env.BENCH_ACCOUNTS || count);
const sleep = (ms) => new Promise((resolve) => setTimeout(resolve, ms));

async function freshDatabase(name) {
  const admin = new Client({ user: 'postgres', database: 'postgres' });
  await admin.connect();
  await admin.query(`DROP DATABASE IF EXISTS ${name}`);
  await admin.query(`CREATE DATABASE ${name} OWNER app`);
  await admin.end();
  const owner = new Client({ user: 'postgres', database: name });
  await owner.connect();
  await owner.query('CREATE EXTENSION idempotency');
  await owner.end();
  const app = new Client({ user: 'app', database: name });
  await app.connect();
  await app.query(fs.readFileSync(path.join(__dirname, 'schema.sql'), 'utf8'));
  await app.query('INSERT INTO public.accounts (account, balance) SELECT g, 1000 FROM generate_series(51, $1) g',
    [accounts]);
  await app.end();
}

async function purge(url) {
  const connection = await amqp.connect(url);
  const channel = await connection.createChannel();
  await declareTopology(channel);
  for (const queue of [QUEUE, DEAD_LETTERS, REPLIES])
    await channel.purgeQueue(queue);
  await connection.close();
}

async function run(label, flags, database) {
  await freshDatabase(database);
  await purge(process.env.AMQP_URL);
  await publish(process.env.AMQP_URL, count, { plainOnly: true, accounts });
  const files = [];
  const children = [];
  for (let i = 0; i < consumers; i++) {
    const file = path.join(logDir, `${database}-${i}.log`);
    const out = fs.openSync(file, 'w');
    children.push(spawn(process.execPath, [path.join(__dirname, 'consumer.js'), ...flags], {
      env: { ...process.env, PGUSER: 'app', PGDATABASE: database }, stdio: ['ignore', out, out],
    }));
    fs.closeSync(out);
    files.push(file);
  }
  let events = [];
  for (;;) {
    await sleep(200);
    events = files.flatMap((file) => fs.readFileSync(file, 'utf8').split('\n').filter(Boolean).map(JSON.parse))
      .filter((line) => line.event === 'acked' || line.event === 'dead-lettered');
    if (events.length >= count) break;
    if (children.some((child) => child.exitCode !== null))
      throw new Error(`a consumer of ${label} exited early (logs in ${logDir})`);
  }
  for (const child of children) child.kill('SIGTERM');
  await Promise.all(children.map((child) => new Promise((resolve) => {
    if (child.exitCode !== null) resolve(); else child.on('exit', resolve);
  })));
  const times = events.map((line) => line.t).sort((a, b) => a - b);
  const seconds = (times[times.length - 1] - times[0]) / 1000;
  const rate = (events.length - 1) / seconds;
  const dead = events.filter((line) => line.event === 'dead-lettered').length;
  console.log(`${label.padEnd(26)} ${String(events.length).padStart(6)} messages  ${seconds.toFixed(2).padStart(7)} s  `
    + `${rate.toFixed(0).padStart(6)} msg/s${dead ? `  (${dead} dead-lettered)` : ''}`);
  return rate;
}

async function main() {
  console.log(`bench: ${count} messages on ${accounts} accounts, ${consumers} consumers, per message with prefetch 16, `
    + `batches of ${batch} with prefetch ${2 * batch}, node ${process.version}`);
  const legs = [
    ['extension per message', [], 'ext'],
    ['plain per message', ['--plain'], 'plain'],
    ['extension batch', ['--batch', String(batch)], 'ext_batch'],
    ['plain batch', ['--plain', '--batch', String(batch)], 'plain_batch'],
  ];
  const ratios = [];
  for (let round = 1; round <= 2; round++) {
    const rate = {};
    for (const [label, flags, name] of legs)
      rate[name] = await run(`${label} run ${round}`, flags, `bench_${name}_${round}`);
    const ratio = {
      'extension/plain per message': rate.ext / rate.plain,
      'extension batch/plain per message': rate.ext_batch / rate.plain,
      'extension batch/plain batch': rate.ext_batch / rate.plain_batch,
      'plain batch/plain per message': rate.plain_batch / rate.plain,
    };
    ratios.push(ratio);
    console.log(`ratios run ${round}: ${Object.entries(ratio).map(([k, v]) => `${k} = ${v.toFixed(2)}`).join('; ')}`);
  }
  for (const name of Object.keys(ratios[0]))
    console.log(`bench: ${name}: ${ratios.map((r) => r[name].toFixed(2)).join(', ')}`);
}

main().catch((error) => {
  console.error(error);
  process.exit(1);
});
