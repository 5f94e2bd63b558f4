'use strict';
// The fault storm: publishes STORM_MESSAGES (default 10000) transfers with
// confirms, consumes them with STORM_CONSUMERS (default 3) competing
// consumer processes, per message and in batch mode (STORM_BATCH_SIZE
// messages per transaction, default 8; every other pair of clean spawns, and
// the faults marked batch), while
//   - consumers SIGKILL themselves at chosen points (before processing,
//     inside the transaction, after the commit before the ack; in batch
//     mode inside a batch's transaction and after its commit before any of
//     its acks, so that the whole batch is redelivered),
//   - the storm SIGKILLs running consumers from outside at random moments,
//   - one consumer closes its channel with deliveries in flight,
//   - the broker is restarted once (STORM_RESTART_BROKER, a shell command),
// respawning consumers as they die, until every message has been settled;
// then checks every message id (check.js) and runs the negative controls
// (controls.js): a planted fault for every kind of violation the checker
// reports, each of which it must flag. A fault counts only when it landed
// (the consumer's log line before its SIGKILL and its exit by SIGKILL; the
// database showing the commit of an after-commit kill; deliveries in flight
// at the channel close; consumers that lost their connection in the
// restart). The storm also requires IK409 requeues (two deliveries of one
// key at the same time) to have happened. Prints one line per check
// ("ok - ..." or "not ok - ...") and "<label> checks: N passed, M failed".
//
//   AMQP_URL=... PGHOST=... PGDATABASE=... PGUSER=... STORM_RESTART_BROKER='...' node storm.js LOGDIR

const fs = require('node:fs');
const path = require('node:path');
const { spawn, execSync } = require('node:child_process');
const amqp = require('amqplib');
const { Client } = require('pg');
const { publish } = require('./publisher');
const { check } = require('./check');
const { controls } = require('./controls');
const { QUEUE, DEAD_LETTERS, REPLIES } = require('./topology');

const logDir = process.argv[2] || fs.mkdtempSync('/tmp/storm-');
const count = Number(process.env.STORM_MESSAGES || 10000);
const consumers = Number(process.env.STORM_CONSUMERS || 3);
const deadlineMs = Number(process.env.STORM_DEADLINE_S || 400) * 1000;
const random = (low, high) => low + Math.floor(Math.random() * (high - low + 1));
const sleep = (ms) => new Promise((resolve) => setTimeout(resolve, ms));
const batchSize = Number(process.env.STORM_BATCH_SIZE || 8);

// The faults the spawned consumers carry, in spawn order; later spawns run
// clean; a fault runs in consumer.js unless it names its language. A fault
// whose consumer died of something else first (the broker
// restart, an outside kill) goes back to the queue for a later spawn.
const faultsOn = process.env.STORM_FAULTS !== 'off';
const label = faultsOn ? 'storm' : 'example';
const say = (line) => console.log(`${label}: ${line}`);
const selfFaults = !faultsOn ? [] : [
  { STORM_KILL_POINT: 'after-commit', STORM_KILL_AT: random(100, 600) },
  { language: 'python', STORM_KILL_POINT: 'after-commit', STORM_KILL_AT: random(100, 600) },
  { STORM_KILL_POINT: 'in-transaction', STORM_KILL_AT: random(100, 600) },
  { STORM_KILL_POINT: 'before-processing', STORM_KILL_AT: random(100, 600) },
  { STORM_BATCH: batchSize, STORM_KILL_POINT: 'after-commit', STORM_KILL_AT: random(100, 600) },
  { language: 'python', STORM_BATCH: batchSize, STORM_KILL_POINT: 'after-commit', STORM_KILL_AT: random(100, 600) },
  { STORM_BATCH: batchSize, STORM_KILL_POINT: 'in-transaction', STORM_KILL_AT: random(100, 600) },
  { STORM_CLOSE_CHANNEL_AT: random(200, 800) },
  { STORM_KILL_POINT: 'after-commit', STORM_KILL_AT: random(100, 600) },
  { STORM_KILL_POINT: 'in-transaction', STORM_KILL_AT: random(100, 600) },
  { STORM_KILL_POINT: 'before-processing', STORM_KILL_AT: random(100, 600) },
];
const externalKills = faultsOn ? 2 : 0;

const landed = { 'after-commit': 0, 'in-transaction': 0, 'before-processing': 0, 'python-after-commit': 0,
  'batch-after-commit': 0, 'python-batch-after-commit': 0, 'batch-in-transaction': 0,
  'channel-close': 0, 'external-kill': 0, 'broker-restart': 0 };
// The name a landed kill counts under: its point, in batch mode and in Python.
const killKind = (entry, point) => `${entry.language === 'python' ? 'python-' : ''}${entry.batch ? 'batch-' : ''}${point}`;
const missed = [];
const children = new Set();
let spawned = 0;
let externalDone = 0;

function readLog(file) {
  // Lines that are not JSON (a stack trace) are kept as text.
  return fs.readFileSync(file, 'utf8').split('\n').filter(Boolean).map((line) => {
    try {
      return JSON.parse(line);
    } catch {
      return { event: 'text', text: line };
    }
  });
}

// Consumers without a fault take turns in the languages of STORM_LANGUAGES
// (default node,python: consumer.js and consumer.py compete for the queue),
// each language's turns alternating between per message and batch mode; a
// fault runs in the language and mode it names, else in consumer.js, per
// message.
const languages = (process.env.STORM_LANGUAGES || 'node,python').split(',');
let cleanSpawns = 0;
function spawnConsumer() {
  const fault = selfFaults.shift() || {};
  const { language: faultLanguage, ...faultEnv } = fault;
  let language = faultLanguage || 'node';
  if (!Object.keys(fault).length) {
    language = languages[cleanSpawns % languages.length];
    if (batchSize > 1 && Math.floor(cleanSpawns / languages.length) % 2 === 1)
      faultEnv.STORM_BATCH = batchSize;
    cleanSpawns++;
  }
  const batch = Number(faultEnv.STORM_BATCH || 1) > 1;
  const file = path.join(logDir, `consumer-${++spawned}-${language}${batch ? '-batch' : ''}.log`);
  const out = fs.openSync(file, 'w');
  const [command, script] = language === 'python' ? ['/usr/bin/python3', 'consumer.py'] : [process.execPath, 'consumer.js'];
  const child = spawn(command, [path.join(__dirname, script)], {
    env: { ...process.env, ...Object.fromEntries(Object.entries(faultEnv).map(([k, v]) => [k, String(v)])),
      PYTHONPATH: path.join(__dirname, '..', '..', 'packages', 'python', 'src') },
    stdio: ['ignore', out, out],
  });
  fs.closeSync(out);
  const entry = { child, file, fault, language, batch, externallyKilled: false, exited: null };
  child.on('exit', (code, signal) => { entry.exited = { code, signal }; });
  children.add(entry);
  return entry;
}

// Counts the faults an exited consumer shows as landed.
async function account(entry, db) {
  const { signal } = entry.exited;
  const lines = readLog(entry.file);
  const kill = lines.find((line) => line.event === 'kill');
  if (entry.externallyKilled) {
    if (signal === 'SIGKILL' && !kill) landed['external-kill']++;
    else externalDone--; // it had died already: another consumer gets the kill
  }
  const close = lines.find((line) => line.event === 'channel-close');
  if ((entry.fault.STORM_KILL_POINT && !kill) || (entry.fault.STORM_CLOSE_CHANNEL_AT && !close)) {
    selfFaults.push(entry.fault); // it died of something else first: a later consumer carries it
    return lines;
  }
  if (entry.fault.STORM_KILL_POINT) {
    if (kill && signal === 'SIGKILL') {
      if (kill.point === 'after-commit') {
        const { rows: [row] } = await db.query('SELECT state FROM idempotency.lookup($1)', [kill.id]);
        if (row.state === 'done') landed[killKind(entry, 'after-commit')]++;
        else missed.push(`after-commit kill of ${kill.id}: the key is ${row.state}`);
      } else {
        landed[killKind(entry, kill.point)]++;
      }
    } else {
      missed.push(`${entry.fault.STORM_KILL_POINT} kill in ${entry.file}: exit ${JSON.stringify(entry.exited)}`);
    }
  }
  if (entry.fault.STORM_CLOSE_CHANNEL_AT) {
    if (close.in_flight > 1) landed['channel-close']++;
    else missed.push(`channel close in ${entry.file}: only ${close.in_flight} in flight`);
  }
  return lines;
}

async function queueDepth(url) {
  const connection = await amqp.connect(url);
  try {
    const channel = await connection.createChannel();
    const { messageCount } = await channel.checkQueue(QUEUE);
    return messageCount;
  } finally {
    await connection.close().catch(() => {});
  }
}

async function drain(url, queue) {
  const connection = await amqp.connect(url);
  const messages = [];
  try {
    const channel = await connection.createChannel();
    for (;;) {
      const message = await channel.get(queue, { noAck: true });
      if (!message) break;
      messages.push(message);
    }
  } finally {
    await connection.close();
  }
  return messages;
}

async function main() {
  const url = process.env.AMQP_URL;
  const started = Date.now();
  const db = new Client();
  await db.connect();
  const messages = await publish(url, count);
  say(`published and confirmed ${messages.length} messages (${count} ids) in ${Date.now() - started} ms`);

  const allLines = [];
  let restarted = !faultsOn;
  let nextExternalAt = Date.now() + random(3000, 8000);
  let finishing = false;
  let settledPolls = 0;
  for (let i = 0; i < consumers; i++)
    spawnConsumer();
  for (;;) {
    if (Date.now() - started > deadlineMs)
      throw new Error(`the storm did not settle within ${deadlineMs / 1000} s (logs in ${logDir})`);
    await sleep(250);
    for (const entry of [...children]) {
      if (!entry.exited) continue;
      children.delete(entry);
      allLines.push(...await account(entry, db));
      if (!finishing) {
        if (entry.exited.code === 2 || entry.exited.code === 3) await sleep(500); // the broker may be away
        spawnConsumer();
      }
    }
    if (finishing) {
      if (children.size !== 0) continue;
      const depth = await queueDepth(url);
      if (depth === 0) break;
      say(`${depth} messages still queued: consumers again`);
      finishing = false;
      for (let i = 0; i < consumers; i++) spawnConsumer();
      continue;
    }
    const { rows: [{ applied }] } = await db.query('SELECT count(*)::int AS applied FROM public.ledger');
    if (!restarted && applied >= count * 0.4) {
      restarted = true;
      say(`restarting the broker at ${applied} applied messages`);
      execSync(process.env.STORM_RESTART_BROKER, { stdio: 'inherit' });
      landed['broker-restart']++;
    }
    if (externalDone < externalKills && Date.now() >= nextExternalAt) {
      const running = [...children].filter((entry) => !entry.exited);
      if (running.length) {
        const victim = running[random(0, running.length - 1)];
        victim.externallyKilled = true;
        victim.child.kill('SIGKILL');
        externalDone++;
        nextExternalAt = Date.now() + random(3000, 8000);
      }
    }
    // Self faults still queued when the queue runs dry are not waited for:
    // a kind that never landed fails the run below.
    const faultsDone = externalDone >= externalKills && restarted;
    let depth = -1;
    if (faultsDone) depth = await queueDepth(url).catch(() => -1);
    settledPolls = depth === 0 ? settledPolls + 1 : 0;
    if (settledPolls >= 4) {
      finishing = true;
      for (const entry of children) entry.child.kill('SIGTERM');
    }
  }
  const consumeMs = Date.now() - started;
  const connectionsLost = allLines.filter((line) => line.event === 'connection-closed').length;
  if (faultsOn && connectionsLost === 0) {
    landed['broker-restart'] = 0;
    missed.push('broker restart: no consumer lost its connection');
  }

  const replies = (await drain(url, REPLIES)).map((message) => ({
    id: message.properties.correlationId, text: message.content.toString(), answer: JSON.parse(message.content.toString()),
  }));
  const deadLetters = (await drain(url, DEAD_LETTERS)).map((message) => ({
    id: message.properties.messageId, code: message.properties.headers['x-idempotency-code'],
    reason: message.properties.headers['x-idempotency-reason'], payload: JSON.parse(message.content.toString()),
  }));
  const violations = await check(db, messages, replies, deadLetters, { queueDepth: await queueDepth(url) });

  const controlResults = await controls(db, messages, replies, deadLetters);

  const acked = allLines.filter((line) => line.event === 'acked');
  const ackedByPython = acked.filter((line) => line.consumer === 'python').length;
  const redelivered = acked.filter((line) => line.redelivered).length;
  const ackedInBatches = acked.filter((line) => line.batch).length;
  const replayedInBatches = acked.filter((line) => line.batch
    && (line.outcome === 'replayed' || line.outcome === 'replayed_error')).length;
  const redeliveredReplayedInBatches = acked.filter((line) => line.batch && line.redelivered
    && (line.outcome === 'replayed' || line.outcome === 'replayed_error')).length;
  const replayed = acked.filter((line) => line.outcome === 'replayed' || line.outcome === 'replayed_error').length;
  const requeued = allLines.filter((line) => line.event === 'requeued').length;
  const requeuedIK409 = allLines.filter((line) => line.event === 'requeued' && line.code === 'IK409').length;
  const { rows: [{ effects }] } = await db.query('SELECT count(*)::int AS effects FROM public.ledger');
  await db.end();

  say(`consumers spawned: ${spawned}; settled after ${consumeMs} ms; deliveries acked by Python consumers: ${ackedByPython}; `
    + `in batches of ${batchSize}: ${ackedInBatches} (replayed ${replayedInBatches}, of them redelivered `
    + `${redeliveredReplayedInBatches})`);
  if (faultsOn)
    say(`faults landed: ${Object.entries(landed).map(([k, v]) => `${k} ${v}`).join(', ')}`);
  for (const fault of selfFaults) say(`fault never reached: ${JSON.stringify(fault)}`);
  for (const line of missed) say(`fault not counted: ${line}`);
  say(`deliveries acked ${acked.length} (redelivered ${redelivered}, replayed ${replayed}), requeues ${requeued} `
    + `(IK409 ${requeuedIK409}), effects ${effects}, replies ${replies.length}, dead letters ${deadLetters.length}`);
  for (const violation of violations.slice(0, 30)) say(`VIOLATION ${violation}`);

  const checks = [
    [`${count} message ids checked, no violation`, messages.length > 0 && violations.length === 0],
    ...controlResults.map(({ name, flagged }) => [`the checker flags ${name}`, flagged]),
  ];
  if (languages.includes('python'))
    checks.push(['a Python consumer acked deliveries', ackedByPython > 0]);
  if (faultsOn && batchSize > 1) {
    checks.push(['consumers in batch mode acked deliveries', ackedInBatches > 0]);
    checks.push(['consumers in batch mode replayed deliveries (redeliveries, published duplicates)',
      replayedInBatches > 0]);
  }
  if (faultsOn) {
    for (const [kind, n] of Object.entries(landed))
      checks.push([`fault landed: ${kind}`, n > 0]);
    checks.push(['IK409 requeues happened (two deliveries of one key at the same time)', requeuedIK409 > 0]);
  }
  for (const [name, ok] of checks)
    console.log(`${ok ? 'ok' : 'not ok'} - ${name}`);
  const failedChecks = checks.filter(([, ok]) => !ok).length;
  console.log(JSON.stringify({ [label]: { messages: messages.length, ids: count, violations: violations.length,
    landed, redelivered, replayed, acked_in_batches: ackedInBatches, replayed_in_batches: replayedInBatches,
    redelivered_replayed_in_batches: redeliveredReplayedInBatches, requeued, requeued_ik409: requeuedIK409, effects, replies: replies.length,
    dead_letters: deadLetters.length, consume_ms: consumeMs } }));
  console.log(`${label} checks: ${checks.length - failedChecks} passed, ${failedChecks} failed`);
  process.exit(failedChecks === 0 ? 0 : 1);
}

main().catch((error) => {
  console.error(error);
  for (const entry of children) entry.child.kill('SIGKILL');
  process.exit(1);
});
