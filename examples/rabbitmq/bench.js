'use strict';
// Messages per second of the same consumer with the extension (consume():
// claim, apply, complete, COMMIT, ack) and without it (--plain: apply,
// COMMIT, ack), two runs each, alternating, each on a fresh database:
// BENCH_MESSAGES (default 5000) plain transfers published with confirms
// first, then consumed by BENCH_CONSUMERS (default 2) competing consumers
// with prefetch 16. The rate is the settled deliveries over the time from
// the first ack to the last one, as the consumers logged them.
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
  await publish(process.env.AMQP_URL, count, { plainOnly: true });
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
  console.log(`${label.padEnd(16)} ${String(events.length).padStart(6)} messages  ${seconds.toFixed(2).padStart(7)} s  `
    + `${rate.toFixed(0).padStart(6)} msg/s${dead ? `  (${dead} dead-lettered)` : ''}`);
  return rate;
}

async function main() {
  console.log(`bench: ${count} messages, ${consumers} consumers, prefetch 16, node ${process.version}`);
  const ratios = [];
  for (let round = 1; round <= 2; round++) {
    const withExtension = await run(`extension run ${round}`, [], `bench_ext_${round}`);
    const without = await run(`plain run ${round}`, ['--plain'], `bench_plain_${round}`);
    ratios.push(withExtension / without);
    console.log(`ratio run ${round}: extension/plain = ${(withExtension / without).toFixed(2)}`);
  }
  console.log(`bench: ratios ${ratios.map((r) => r.toFixed(2)).join(', ')}`);
}

main().catch((error) => {
  console.error(error);
  process.exit(1);
});
