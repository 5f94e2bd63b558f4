'use strict';
// Messages per second of the same consumer with the extension (consume():
// claim, apply, complete, COMMIT, ack) and without it (--plain: apply,
// COMMIT, ack), per message (prefetch 16) and in batches of BENCH_BATCH
// (default 32; one claim_batch, the transfers, one complete_batch, COMMIT,
// then the acks; plain: the transfers, COMMIT, acks; prefetch twice the
// batch): four legs (BENCH_LEGS, default ext,plain,ext_batch,plain_batch),
// BENCH_RUNS runs each (default 2), the legs alternating within a run, each
// on a fresh database: BENCH_MESSAGES (default 5000) plain transfers
// published with confirms first, then consumed by BENCH_CONSUMERS (default
// 2) competing consumers. The transfers go to BENCH_ACCOUNTS accounts
// (default: one per message) in turn: with few accounts, concurrent batches
// wait for each other's account rows and deadlock (plain batches are
// dead-lettered whole, the extension's rerun without the message), which
// measures the workload, not the inbox. The rate is the settled deliveries
// over the time from the first ack to the last one, as the consumers logged
// them. Each leg also prints the CPU time per message of the consumers, the
// PostgreSQL cluster and the broker (from /proc, between the consumers'
// start and the last settlement): on a machine with few cores the rate is
// bound by that sum, and the split shows where a leg spends it.
//
//   AMQP_URL=... PGHOST=... PGPORT=... node bench.js LOGDIR

const fs = require('node:fs');
const path = require('node:path');
const { spawn } = require('node:child_process');
const { StringDecoder } = require('node:string_decoder');
const amqp = require('amqplib');
const { Client } = require('pg');
const { publish } = require('./publisher');
const { QUEUE, DEAD_LETTERS, REPLIES, declareTopology } = require('./topology');

const logDir = process.argv[2] || fs.mkdtempSync('/tmp/bench-');
const count = Number(process.env.BENCH_MESSAGES || 5000);
const consumers = Number(process.env.BENCH_CONSUMERS || 2);
const batch = Number(process.env.BENCH_BATCH || 32);
const accounts = Number(process.env.BENCH_ACCOUNTS || count);
const runs = Number(process.env.BENCH_RUNS || 2);
const sleep = (ms) => new Promise((resolve) => setTimeout(resolve, ms));
const TICKS_PER_SECOND = 100; // USER_HZ, what /proc/PID/stat counts in on Linux

// CPU seconds (user + system, with the reaped children's) of the processes.
function cpuSeconds(pids) {
  let ticks = 0;
  for (const pid of pids) {
    try {
      const stat = fs.readFileSync(`/proc/${pid}/stat`, 'utf8');
      const fields = stat.slice(stat.lastIndexOf(')') + 2).split(' ');
      ticks += Number(fields[11]) + Number(fields[12]) + Number(fields[13]) + Number(fields[14]);
    } catch { /* gone since it was listed */ }
  }
  return ticks / TICKS_PER_SECOND;
}

const processesNamed = (name) => fs.readdirSync('/proc').filter((entry) => /^[0-9]+$/.test(entry)).filter((pid) => {
  try { return fs.readFileSync(`/proc/${pid}/comm`, 'utf8').trim() === name; } catch { return false; }
});

// The CPU seconds used so far by the cluster's and the broker's processes
// (those that ended meanwhile are counted by their parents once reaped).
const serverSeconds = () => ({ postgres: cpuSeconds(processesNamed('postgres')), broker: cpuSeconds(processesNamed('beam.smp')) });

// What the reader's file gained since it was last read (it is read from
// where it stopped; a character cut at the end waits in the decoder).
function readAppended(reader) {
  const buffer = Buffer.alloc(1 << 16);
  let text = '';
  for (let n; (n = fs.readSync(reader.fd, buffer, 0, buffer.length, null)) > 0;)
    text += reader.decoder.write(buffer.subarray(0, n));
  return text;
}

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
  const before = serverSeconds();
  for (let i = 0; i < consumers; i++) {
    const file = path.join(logDir, `${database}-${i}.log`);
    const out = fs.openSync(file, 'w');
    children.push(spawn(process.execPath, [path.join(__dirname, 'consumer.js'), ...flags], {
      env: { ...process.env, PGUSER: 'app', PGDATABASE: database }, stdio: ['ignore', out, out],
    }));
    fs.closeSync(out);
    files.push(file);
  }
  // Each poll reads only what the logs gained since the last one, so that the
  // driver's own CPU does not grow with the lines already read.
  const events = [];
  const readers = files.map((file) => ({ fd: fs.openSync(file, 'r'), decoder: new StringDecoder('utf8'), rest: '' }));
  for (;;) {
    await sleep(200);
    for (const reader of readers) {
      const lines = (reader.rest + readAppended(reader)).split('\n');
      reader.rest = lines.pop();
      for (const line of lines.filter(Boolean).map(JSON.parse))
        if (line.event === 'acked' || line.event === 'dead-lettered') events.push(line);
    }
    if (events.length >= count) break;
    if (children.some((child) => child.exitCode !== null))
      throw new Error(`a consumer of ${label} exited early (logs in ${logDir})`);
  }
  for (const reader of readers) fs.closeSync(reader.fd);
  const after = serverSeconds();
  const consumerSeconds = cpuSeconds(children.map((child) => child.pid));
  for (const child of children) child.kill('SIGTERM');
  await Promise.all(children.map((child) => new Promise((resolve) => {
    if (child.exitCode !== null) resolve(); else child.on('exit', resolve);
  })));
  const times = events.map((line) => line.t).sort((a, b) => a - b);
  const seconds = (times[times.length - 1] - times[0]) / 1000;
  const rate = (events.length - 1) / seconds;
  const dead = events.filter((line) => line.event === 'dead-lettered').length;
  const perMessage = (cpu) => ((1000 * cpu) / events.length).toFixed(3);
  console.log(`${label.padEnd(26)} ${String(events.length).padStart(6)} messages  ${seconds.toFixed(2).padStart(7)} s  `
    + `${rate.toFixed(0).padStart(6)} msg/s  CPU ms/message: consumers ${perMessage(consumerSeconds)}, `
    + `postgres ${perMessage(after.postgres - before.postgres)}, broker ${perMessage(after.broker - before.broker)}`
    + `${dead ? `  (${dead} dead-lettered)` : ''}`);
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
  const only = process.env.BENCH_LEGS ? process.env.BENCH_LEGS.split(',') : null;
  const chosen = legs.filter(([, , name]) => !only || only.includes(name));
  if (chosen.length === 0)
    throw new Error(`BENCH_LEGS names none of ${legs.map(([, , name]) => name).join(', ')}`);
  const ratioOf = {
    'extension/plain per message': ['ext', 'plain'],
    'extension batch/plain per message': ['ext_batch', 'plain'],
    'extension batch/plain batch': ['ext_batch', 'plain_batch'],
    'plain batch/plain per message': ['plain_batch', 'plain'],
  };
  const ratios = [];
  for (let round = 1; round <= runs; round++) {
    const rate = {};
    for (const [label, flags, name] of chosen)
      rate[name] = await run(`${label} run ${round}`, flags, `bench_${name}_${round}`);
    const ratio = Object.fromEntries(Object.entries(ratioOf)
      .filter(([, [a, b]]) => a in rate && b in rate)
      .map(([name, [a, b]]) => [name, rate[a] / rate[b]]));
    ratios.push(ratio);
    if (Object.keys(ratio).length > 0)
      console.log(`ratios run ${round}: ${Object.entries(ratio).map(([k, v]) => `${k} = ${v.toFixed(2)}`).join('; ')}`);
  }
  for (const name of Object.keys(ratios[0]))
    console.log(`bench: ${name}: ${ratios.map((r) => r[name].toFixed(2)).join(', ')}`);
}

main().catch((error) => {
  console.error(error);
  process.exit(1);
});
