'use strict';
// Messages per second of the same consumer, in Node (consumer.js) and in
// Python (consumer.py), three ways: with the extension (ext: consume(),
// BEGIN with the claim, the transfer, complete with COMMIT, reply, ack),
// with the textbook inbox instead (--textbook: BEGIN, the message id
// inserted into processed_messages ON CONFLICT DO NOTHING, the transfer,
// COMMIT, reply, ack) and without deduplication (--plain: BEGIN, the
// transfer, COMMIT, reply, ack); each per message (prefetch 16) and in
// batches of BENCH_BATCH (default 32, prefetch twice that; per batch one
// claim_batch, the transfers, one complete_batch; the textbook one INSERT of
// the batch's ids; then COMMIT, the replies, the acks). Twelve legs
// (BENCH_LEGS picks some: ext, plain, textbook, ext_batch, plain_batch,
// textbook_batch, and the same with py_ for Python), BENCH_RUNS runs each
// (default 2), the legs alternating within a run, each on a fresh database:
// BENCH_MESSAGES (default 5000) plain transfers published with confirms
// first, then consumed by BENCH_CONSUMERS (default 2) competing consumers.
// The transfers go to BENCH_ACCOUNTS accounts (default: one per message) in
// turn: with few accounts, concurrent batches wait for each other's account
// rows and deadlock, which measures the workload, not the inbox. The rate is
// the settled deliveries over the time from the first ack to the last one,
// as the consumers logged them. Each leg also prints the CPU time per
// message of the consumers, the bench's PostgreSQL cluster (the postmaster
// and its children) and its broker node (from /proc, between the consumers'
// start and the last settlement): on a machine with few cores the rate is
// bound by that sum, and the split shows where a leg spends it.
// BENCH_PROFILE=DIR writes a CPU profile of each consumer there (Node's
// --cpu-prof, Python's cProfile).
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

const readProc = (pid, file) => {
  try { return fs.readFileSync(`/proc/${pid}/${file}`, 'utf8'); } catch { return ''; }
};
const processes = () => fs.readdirSync('/proc').filter((entry) => /^[0-9]+$/.test(entry));
const parentOf = (pid) => (readProc(pid, 'status').match(/^PPid:\s+([0-9]+)/m) || [])[1];

// The processes of the bench's own cluster and broker, not those of other
// clusters and nodes on the machine: the postmaster and its children, and
// the broker node's beam.smp (its home directory is BENCH_BROKER_HOME).
const clusterProcesses = (postmaster) => [postmaster, ...processes().filter((pid) => parentOf(pid) === postmaster)];
const brokerProcesses = () => processes().filter((pid) => readProc(pid, 'comm').trim() === 'beam.smp'
  && (!process.env.BENCH_BROKER_HOME || readProc(pid, 'cmdline').split('\0').includes(process.env.BENCH_BROKER_HOME)));

// The CPU seconds used so far by the cluster's and the broker's processes
// (those that ended meanwhile are counted by their parents once reaped).
const serverSeconds = (postmaster) => ({
  postgres: cpuSeconds(clusterProcesses(postmaster)), broker: cpuSeconds(brokerProcesses()),
});

async function postmasterPid() {
  const client = new Client({ user: 'postgres', database: 'postgres' });
  await client.connect();
  const { rows: [{ pid }] } = await client.query('SELECT pg_backend_pid() AS pid');
  const postmaster = parentOf(String(pid));
  await client.end();
  if (brokerProcesses().length !== 1)
    throw new Error(`the broker in ${process.env.BENCH_BROKER_HOME} is not one beam.smp process`);
  return postmaster;
}

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

// The consumers of a language: consumer.js or consumer.py.
const commandOf = {
  node: [process.execPath, 'consumer.js'],
  python: ['/usr/bin/python3', 'consumer.py'],
};

async function run(label, language, flags, database) {
  await freshDatabase(database);
  await purge(process.env.AMQP_URL);
  await publish(process.env.AMQP_URL, count, { plainOnly: true, accounts });
  const files = [];
  const children = [];
  const before = serverSeconds(postmaster);
  for (let i = 0; i < consumers; i++) {
    const file = path.join(logDir, `${database}-${i}.log`);
    const out = fs.openSync(file, 'w');
    const [command, script] = commandOf[language];
    let profile = [];
    if (process.env.BENCH_PROFILE && language === 'node')
      profile = ['--cpu-prof', `--cpu-prof-dir=${process.env.BENCH_PROFILE}`];
    else if (process.env.BENCH_PROFILE) // python
      profile = ['-m', 'cProfile', '-o', path.join(process.env.BENCH_PROFILE, `${database}-${i}.pstats`)];
    children.push(spawn(command, [...profile, path.join(__dirname, script), ...flags], {
      env: { ...process.env, PGUSER: 'app', PGDATABASE: database,
        PYTHONPATH: path.join(__dirname, '..', '..', 'packages', 'python', 'src') },
      stdio: ['ignore', out, out],
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
  const after = serverSeconds(postmaster);
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
  console.log(`${label.padEnd(34)} ${String(events.length).padStart(6)} messages  ${seconds.toFixed(2).padStart(7)} s  `
    + `${rate.toFixed(0).padStart(6)} msg/s  CPU ms/message: consumers ${perMessage(consumerSeconds)}, `
    + `postgres ${perMessage(after.postgres - before.postgres)}, broker ${perMessage(after.broker - before.broker)}`
    + `${dead ? `  (${dead} dead-lettered)` : ''}`);
  return rate;
}

// The legs of a language (prefix: '' for Node, 'py_' for Python), and the
// ratios of its rates that are printed.
const modes = [
  ['ext per message', [], 'ext'],
  ['plain per message', ['--plain'], 'plain'],
  ['textbook per message', ['--textbook'], 'textbook'],
  ['ext batch', ['--batch', String(batch)], 'ext_batch'],
  ['plain batch', ['--plain', '--batch', String(batch)], 'plain_batch'],
  ['textbook batch', ['--textbook', '--batch', String(batch)], 'textbook_batch'],
];
const ratiosOfModes = {
  'ext/plain per message': ['ext', 'plain'],
  'ext/textbook per message': ['ext', 'textbook'],
  'ext batch/plain batch': ['ext_batch', 'plain_batch'],
  'ext batch/textbook batch': ['ext_batch', 'textbook_batch'],
  'ext batch/plain per message': ['ext_batch', 'plain'],
  'plain batch/plain per message': ['plain_batch', 'plain'],
};
const languages = [['node', ''], ['python', 'py_']];
let postmaster;

async function main() {
  console.log(`bench: ${count} messages on ${accounts} accounts, ${consumers} consumers, per message with prefetch 16, `
    + `batches of ${batch} with prefetch ${2 * batch}, node ${process.version}, /usr/bin/python3 (psycopg2, pika)`);
  postmaster = await postmasterPid();
  const legs = languages.flatMap(([language, prefix]) => modes.map(([label, flags, name]) =>
    [`${language} ${label}`, language, flags, `${prefix}${name}`]));
  const only = process.env.BENCH_LEGS ? process.env.BENCH_LEGS.split(',') : null;
  const chosen = legs.filter(([, , , name]) => !only || only.includes(name));
  if (chosen.length === 0)
    throw new Error(`BENCH_LEGS names none of ${legs.map(([, , , name]) => name).join(', ')}`);
  const ratioOf = Object.fromEntries(languages.flatMap(([language, prefix]) => Object.entries(ratiosOfModes)
    .map(([name, [a, b]]) => [`${language} ${name}`, [`${prefix}${a}`, `${prefix}${b}`]])));
  const ratios = [];
  for (let round = 1; round <= runs; round++) {
    const rate = {};
    for (const [label, language, flags, name] of chosen)
      rate[name] = await run(`${label} run ${round}`, language, flags, `bench_${name}_${round}`);
    const ratio = Object.fromEntries(Object.entries(ratioOf)
      .filter(([, [a, b]]) => a in rate && b in rate)
      .map(([name, [a, b]]) => [name, rate[a] / rate[b]]));
    ratios.push(ratio);
    for (const [language] of languages) {
      const own = Object.entries(ratio).filter(([name]) => name.startsWith(`${language} `));
      if (own.length > 0)
        console.log(`ratios run ${round}, ${language}: ${own.map(([k, v]) => `${k.slice(language.length + 1)} = ${v.toFixed(2)}`).join('; ')}`);
    }
  }
  for (const name of Object.keys(ratios[0]))
    console.log(`bench: ${name}: ${ratios.map((r) => r[name].toFixed(2)).join(', ')}`);
}

main().catch((error) => {
  console.error(error);
  process.exit(1);
});
