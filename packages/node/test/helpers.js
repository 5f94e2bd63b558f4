'use strict';
// Shared by the tests: a pool on the test database (PGHOST, PGPORT,
// PGDATABASE, PGUSER from the environment), servers on 127.0.0.1 (port 0,
// or TEST_PORT_BASE + n when set), and a raw HTTP/1.1 client that sends
// header bytes exactly as given and reads response header names with their
// casing.

const net = require('node:net');
const { once } = require('node:events');
const { Pool } = require('pg');

function createPool(max = 4) {
  const pool = new Pool({ max });
  pool.on('error', () => {});
  return pool;
}

let nextPort = Number(process.env.TEST_PORT_BASE ?? 0);
async function listen(app) {
  const server = require('node:http').createServer(app);
  server.listen(nextPort === 0 ? 0 : nextPort++, '127.0.0.1');
  await once(server, 'listening');
  return { server, port: server.address().port, url: `http://127.0.0.1:${server.address().port}` };
}

// Sends one request over a fresh connection. headers: array of [name, value]
// where value is a string of latin1 characters (one per byte) or a Buffer.
// Resolves { status, rawHeaders: [[name, value]...], header(name), body }.
function rawRequest(port, { method = 'POST', path = '/', headers = [], body = Buffer.alloc(0) }) {
  const payload = typeof body === 'string' ? Buffer.from(body) : body;
  const head = [Buffer.from(`${method} ${path} HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n`, 'latin1')];
  for (const [name, value] of headers)
    head.push(Buffer.from(`${name}: `, 'latin1'), Buffer.isBuffer(value) ? value : Buffer.from(value, 'latin1'),
      Buffer.from('\r\n'));
  head.push(Buffer.from(`Content-Length: ${payload.length}\r\n\r\n`));
  return new Promise((resolve, reject) => {
    const socket = net.connect(port, '127.0.0.1');
    const chunks = [];
    socket.on('data', (chunk) => chunks.push(chunk));
    socket.on('error', reject);
    socket.on('end', () => {
      const all = Buffer.concat(chunks);
      const split = all.indexOf('\r\n\r\n');
      const lines = all.subarray(0, split).toString('latin1').split('\r\n');
      const status = Number(lines[0].split(' ')[1]);
      const rawHeaders = lines.slice(1).map((line) => {
        const colon = line.indexOf(':');
        return [line.slice(0, colon), line.slice(colon + 1).trim()];
      });
      const header = (name) => rawHeaders.find(([n]) => n.toLowerCase() === name.toLowerCase())?.[1];
      let rest = all.subarray(split + 4);
      if (header('transfer-encoding') === 'chunked')
        rest = dechunk(rest);
      resolve({ status, rawHeaders, header, body: rest, text: rest.toString('utf8') });
    });
    socket.write(Buffer.concat([...head, payload]));
  });
}

function dechunk(buffer) {
  const parts = [];
  let at = 0;
  for (;;) {
    const eol = buffer.indexOf('\r\n', at);
    const size = parseInt(buffer.subarray(at, eol).toString(), 16);
    if (!size)
      return Buffer.concat(parts);
    parts.push(buffer.subarray(eol + 2, eol + 2 + size));
    at = eol + 2 + size + 2;
  }
}

// A JSON POST with a key (undefined: no header).
function postJson(port, path, key, value, extraHeaders = []) {
  const headers = [['Content-Type', 'application/json'], ...extraHeaders];
  if (key !== undefined)
    headers.push(['Idempotency-Key', key]);
  return rawRequest(port, { path, headers, body: JSON.stringify(value) });
}

async function waitFor(condition, what, timeout = 15000) {
  const deadline = Date.now() + timeout;
  while (!(await condition())) {
    if (Date.now() > deadline)
      throw new Error(`timed out waiting for ${what}`);
    await new Promise((resolve) => setTimeout(resolve, 20));
  }
}

// The TTL of keys a test retries after their response expired: past it,
// within idempotency.remember, a retry of the same request gets IK410. Long
// enough that the first request commits within it on a loaded machine.
const SHORT_TTL = '1 second';

// A stand-in for pool whose transactions give the keys they claim
// SHORT_TTL: SET LOCAL right after BEGIN, so that it holds through PgBouncer's
// transaction pooling too.
function shortTtlPool(pool) {
  return {
    async connect() {
      const client = await pool.connect();
      return new Proxy(client, {
        get(target, property) {
          const value = Reflect.get(target, property, target);
          if (property !== 'query')
            return typeof value === 'function' ? value.bind(target) : value;
          return async (text, ...rest) => {
            // BEGIN sent with more statements (the consumer's BEGIN and claim):
            // the setting goes right after it, in the same message.
            if (typeof text === 'string' && text.startsWith('BEGIN; '))
              return target.query(`BEGIN; SELECT pg_catalog.set_config('idempotency.ttl', '${SHORT_TTL}', true); ${
                text.slice('BEGIN; '.length)}`, ...rest);
            const result = await target.query(text, ...rest);
            if (text === 'BEGIN')
              await target.query("SELECT set_config('idempotency.ttl', $1, true)", [SHORT_TTL]);
            return result;
          };
        },
      });
    },
  };
}

// Waits until key's response has expired and the key is remembered
// (lookup's state 'gone').
function waitUntilGone(db, key) {
  return waitFor(async () => (await db.query('SELECT state FROM idempotency.lookup($1)', [key])).rows[0].state === 'gone',
    `key ${key} to be gone`);
}

// A promise with its resolve function: lets a test hold a handler.
function gate() {
  let open;
  const promise = new Promise((resolve) => { open = resolve; });
  return { promise, open };
}

module.exports = {
  createPool, listen, rawRequest, postJson, waitFor, gate, SHORT_TTL, shortTtlPool, waitUntilGone,
};
