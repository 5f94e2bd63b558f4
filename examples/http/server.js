'use strict';
// A payment service with one endpoint, POST /withdrawals, made safe to retry
// by an Idempotency-Key header and idempotency.idempotent_call.
//
//   PGHOST=... PGDATABASE=... PGUSER=... PORT=8080 node server.js
//
// Errors are mapped to HTTP by SQLSTATE only; no error message is parsed.

const http = require('node:http');
const { Pool } = require('pg');

const SQLSTATE = {
  keyInProgress: 'IK409', // the same key is running in another transaction
  keyReused: 'IK422', // the key was used before with a different request
  invalidKey: '22023', // empty, or longer than 255 bytes
  nullKey: '22004',
  serializationFailure: '40001',
  deadlockDetected: '40P01',
  noSuchAccount: 'P0002', // raised by withdraw()
  insufficientFunds: 'PY402', // raised by withdraw()
};

// How long a client should wait before retrying a key that is in progress.
const RETRY_AFTER_SECONDS = 1;
// A transaction that lost a serialization race is simply run again.
const MAX_TRANSACTION_ATTEMPTS = 3;
const MAX_BODY_BYTES = 16 * 1024;

// The request hash is left NULL: the extension fingerprints the statement and
// its arguments, so the same key with another account or amount is IK422.
const CALL_WITHDRAW = `
  SELECT idempotency.idempotent_call($1, NULL, 'SELECT withdraw($1, $2)',
                                     $2::bigint, $3::bigint) AS response`;

const PROBLEM_BASE = 'https://payments.example/problems/';

class HttpProblem extends Error {
  constructor(status, type, title, detail, headers = {}) {
    super(title);
    this.status = status;
    this.type = type;
    this.title = title;
    this.detail = detail;
    this.headers = headers;
  }
}

// The problem (RFC 9457) that answers a database error, or null when the
// error is not one the API expects.
function problemForSqlState(code) {
  switch (code) {
    case SQLSTATE.keyInProgress:
      return new HttpProblem(
        409, 'request-in-progress', 'A request with this Idempotency-Key is in progress',
        'Retry the same request with the same key after Retry-After seconds.',
        { 'Retry-After': String(RETRY_AFTER_SECONDS) });
    case SQLSTATE.keyReused:
      return new HttpProblem(
        422, 'idempotency-key-reused', 'Idempotency-Key reused with a different request',
        'This key was already used for a request with another body; use a new key for a new request.');
    case SQLSTATE.invalidKey:
    case SQLSTATE.nullKey:
      return new HttpProblem(
        400, 'invalid-idempotency-key', 'Invalid Idempotency-Key',
        'An Idempotency-Key must be 1 to 255 bytes long.');
    case SQLSTATE.noSuchAccount:
      return new HttpProblem(404, 'account-not-found', 'No such account');
    case SQLSTATE.insufficientFunds:
      return new HttpProblem(
        422, 'insufficient-funds', 'Insufficient funds',
        'Nothing was withdrawn; the same request may be retried once funds are available.');
    case SQLSTATE.serializationFailure:
    case SQLSTATE.deadlockDetected:
      return new HttpProblem(
        503, 'try-again', 'The request conflicted with another one; retry it',
        undefined, { 'Retry-After': String(RETRY_AFTER_SECONDS) });
    default:
      return null;
  }
}

function isRetryableTransactionError(error) {
  return error.code === SQLSTATE.serializationFailure ||
    error.code === SQLSTATE.deadlockDetected;
}

// Runs the withdrawal in one transaction and reports whether the response
// was replayed: last_call_replayed() must be asked in the same session,
// right after the call.
async function withdrawOnce(pool, key, accountId, amount) {
  const client = await pool.connect();
  let broken;
  try {
    await client.query('BEGIN');
    const call = await client.query(CALL_WITHDRAW, [key, accountId, amount]);
    const replay = await client.query(
      'SELECT idempotency.last_call_replayed() AS replayed');
    await client.query('COMMIT');
    return { body: call.rows[0].response, replayed: replay.rows[0].replayed };
  } catch (error) {
    await client.query('ROLLBACK').catch((rollbackError) => { broken = rollbackError; });
    throw error;
  } finally {
    client.release(broken);
  }
}

async function withdraw(pool, key, accountId, amount) {
  for (let attempt = 1; ; attempt++) {
    try {
      return await withdrawOnce(pool, key, accountId, amount);
    } catch (error) {
      if (!isRetryableTransactionError(error) || attempt >= MAX_TRANSACTION_ATTEMPTS)
        throw error;
    }
  }
}

function readBody(request) {
  return new Promise((resolve, reject) => {
    const chunks = [];
    let size = 0;
    request.on('data', (chunk) => {
      size += chunk.length;
      if (size > MAX_BODY_BYTES) {
        reject(new HttpProblem(413, 'body-too-large', 'Request body too large'));
        request.destroy();
        return;
      }
      chunks.push(chunk);
    });
    request.on('end', () => resolve(Buffer.concat(chunks).toString('utf8')));
    request.on('error', reject);
  });
}

function parseWithdrawal(text) {
  let body;
  try {
    body = JSON.parse(text);
  } catch {
    throw new HttpProblem(400, 'invalid-body', 'The body is not JSON');
  }
  const valid = body !== null && typeof body === 'object' &&
    Number.isSafeInteger(body.account_id) &&
    Number.isSafeInteger(body.amount) && body.amount > 0;
  if (!valid)
    throw new HttpProblem(
      400, 'invalid-body', 'Invalid withdrawal',
      'The body must be {"account_id": <integer>, "amount": <positive integer>}.');
  return { accountId: body.account_id, amount: body.amount };
}

function send(response, status, headers, body) {
  const payload = JSON.stringify(body);
  response.writeHead(status, {
    ...headers,
    'Content-Length': Buffer.byteLength(payload),
  });
  response.end(payload);
}

function sendProblem(response, problem) {
  const body = { type: PROBLEM_BASE + problem.type, title: problem.title, status: problem.status };
  if (problem.detail !== undefined)
    body.detail = problem.detail;
  send(response, problem.status,
    { ...problem.headers, 'Content-Type': 'application/problem+json' }, body);
}

async function handleWithdrawal(pool, request, response) {
  const key = request.headers['idempotency-key'];
  if (key === undefined)
    throw new HttpProblem(400, 'missing-idempotency-key', 'Missing Idempotency-Key header',
      'Send a unique Idempotency-Key with every withdrawal and repeat it on retries.');
  const { accountId, amount } = parseWithdrawal(await readBody(request));

  let result;
  try {
    result = await withdraw(pool, key, accountId, amount);
  } catch (error) {
    throw problemForSqlState(error.code) ?? error;
  }
  const headers = { 'Content-Type': 'application/json' };
  if (result.replayed)
    headers['Idempotent-Replayed'] = 'true';
  send(response, 201, headers, result.body);
}

function createServer(pool) {
  return http.createServer((request, response) => {
    const route = request.method === 'POST' && request.url === '/withdrawals'
      ? handleWithdrawal(pool, request, response)
      : Promise.reject(new HttpProblem(404, 'not-found', 'Not found'));
    route.catch((error) => {
      if (!(error instanceof HttpProblem)) {
        console.error('unexpected error:', error);
        error = new HttpProblem(500, 'internal-error', 'Internal server error');
      }
      if (!response.headersSent)
        sendProblem(response, error);
    });
  });
}

function main() {
  const pool = new Pool({ max: Number(process.env.POOL_SIZE ?? 10) });
  pool.on('error', (error) => console.error('idle database connection failed:', error.message));
  const server = createServer(pool);
  server.listen(Number(process.env.PORT ?? 8080), '127.0.0.1', () => {
    console.log(`listening on http://127.0.0.1:${server.address().port}`);
  });
  process.on('SIGTERM', () => server.close(() => pool.end()));
}

if (require.main === module)
  main();

module.exports = { createServer, problemForSqlState };
