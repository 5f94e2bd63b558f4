'use strict';
// Express middleware that makes a route safe to retry with an
// Idempotency-Key header, on top of idempotency.claim and
// idempotency.complete.
//
//   app.post('/charges', express.json(), idempotent({ pool }), async (req, res) => {
//     await req.db.query('INSERT INTO charges ...');   // the request's transaction
//     res.status(201).json(receipt);
//   });
//
// For each request with a key the middleware opens a transaction on a pool
// client, claims the key and hands the client to the route as `req.db`. The
// route answers as usual; the middleware captures that answer (status, the
// chosen headers, body), stores it with idempotency.complete and commits
// before a byte reaches the client, so the client never sees an answer that
// did not commit. A retry with the same key gets the stored answer again,
// with `Idempotent-Replayed: true`. 5xx answers are not stored: their
// transaction rolls back and a retry runs the route again.
//
// Errors map to HTTP by SQLSTATE only: IK409 (the key is in progress in
// another transaction) is 409 with Retry-After, IK422 (the key was used for
// another request) is 422; both are RFC 9457 problem documents.

const { createHash } = require('node:crypto');

const SQLSTATE = {
  keyInProgress: 'IK409',
  keyReused: 'IK422',
  invalidKey: '22023', // empty, or longer than 255 bytes
};

const MAX_KEY_BYTES = 255;
const DEFAULT_STORED_HEADERS = ['content-type', 'location'];
const DEFAULT_RETRY_AFTER_SECONDS = 1;
const PROBLEM_BASE = 'https://idempotency.example/problems/';

function sendProblem(res, status, type, title, detail, headers = {}) {
  res.status(status).set(headers).type('application/problem+json')
    .send(JSON.stringify({ type: PROBLEM_BASE + type, title, status, detail }));
}

// JSON with object keys in a fixed order, so that the same request body
// hashes the same however the client ordered its fields.
function canonicalJson(value) {
  if (Array.isArray(value))
    return `[${value.map(canonicalJson).join(',')}]`;
  if (value !== null && typeof value === 'object')
    return `{${Object.keys(value).sort()
      .map((key) => `${JSON.stringify(key)}:${canonicalJson(value[key])}`).join(',')}}`;
  return JSON.stringify(value) ?? 'null';
}

// What makes two requests "the same request" for a key: method, path with
// its query, and the body as the body parser before the middleware left it
// (parsed JSON in canonical form, or raw bytes).
function requestHash(req) {
  return createHash('sha256')
    .update(`${req.method}\n${req.originalUrl}\n`)
    .update(Buffer.isBuffer(req.body) ? req.body : canonicalJson(req.body))
    .digest('hex');
}

function isValidKey(key) {
  const bytes = Buffer.byteLength(key);
  return bytes >= 1 && bytes <= MAX_KEY_BYTES;
}

// Sends a response stored by captureResponse, byte for byte.
function replay(res, stored) {
  res.status(stored.status).set(stored.headers).set('Idempotent-Replayed', 'true');
  res.end(stored.body);
}

// Holds back everything the route writes, and calls finish(stored, flush)
// once the route ends its response; flush() then sends it for real. The body
// is stored as text: routes behind this middleware answer JSON, HTML or
// plain text.
function captureResponse(res, storedHeaders, finish) {
  const write = res.write;
  const end = res.end;
  const chunks = [];
  const collect = (chunk, encoding) => {
    if (chunk !== undefined && chunk !== null && typeof chunk !== 'function')
      chunks.push(Buffer.from(chunk, typeof encoding === 'string' ? encoding : undefined));
  };
  res.write = (chunk, encoding, callback) => {
    collect(chunk, encoding);
    if (typeof (callback ?? encoding) === 'function')
      process.nextTick(callback ?? encoding);
    return true;
  };
  res.end = (chunk, encoding, callback) => {
    collect(chunk, encoding);
    res.write = write;
    res.end = end;
    const body = Buffer.concat(chunks);
    const headers = {};
    for (const name of storedHeaders) {
      const value = res.get(name);
      if (value !== undefined)
        headers[name] = value;
    }
    finish(
      { status: res.statusCode, headers, body: body.toString('utf8') },
      () => end.call(res, body, typeof callback === 'function' ? callback : undefined));
    return res;
  };
}

// Options:
//   pool            a pg.Pool
//   required        answer 400 when the header is missing (default true);
//                   when false, a request without a key runs in a plain
//                   transaction and nothing is stored
//   storedHeaders   response headers stored and replayed besides status
//                   and body (default Content-Type and Location)
//   retryAfter      seconds a client should wait after a 409 (default 1)
function idempotent({
  pool, required = true, storedHeaders = DEFAULT_STORED_HEADERS,
  retryAfter = DEFAULT_RETRY_AFTER_SECONDS,
}) {
  const headersToStore = storedHeaders.map((name) => name.toLowerCase());

  return async function idempotencyMiddleware(req, res, next) {
    const key = req.get('Idempotency-Key');
    if (key === undefined && required)
      return sendProblem(res, 400, 'missing-idempotency-key', 'Missing Idempotency-Key header',
        'Send a unique Idempotency-Key with this request and repeat it on retries.');
    if (key !== undefined && !isValidKey(key))
      return sendProblem(res, 400, 'invalid-idempotency-key', 'Invalid Idempotency-Key',
        `An Idempotency-Key must be 1 to ${MAX_KEY_BYTES} bytes long.`);

    const client = await pool.connect();
    let settled = false;
    // Ends the transaction and gives the client back to the pool, once; a
    // client whose ROLLBACK failed is discarded, a failed COMMIT throws.
    const settle = async (command) => {
      if (settled)
        return;
      settled = true;
      let broken;
      try {
        await client.query(command);
      } catch (error) {
        broken = error;
        if (command === 'COMMIT')
          throw error;
      } finally {
        client.release(broken);
      }
    };

    try {
      await client.query('BEGIN');
      if (key !== undefined) {
        const { rows: [claim] } = await client.query(
          'SELECT replayed, response FROM idempotency.claim($1, $2)', [key, requestHash(req)]);
        if (claim.replayed) {
          await settle('COMMIT');
          return replay(res, claim.response);
        }
      }
    } catch (error) {
      await settle('ROLLBACK');
      return answerClaimError(error, res, retryAfter, next);
    }

    // The transaction ends when the route answers, even if the client has
    // gone: a request whose answer is lost still commits, and its retry
    // replays that answer.
    captureResponse(res, headersToStore, async (stored, flush) => {
      try {
        if (stored.status >= 500) {
          await settle('ROLLBACK');
        } else {
          if (key !== undefined)
            await client.query('SELECT idempotency.complete($1, $2)', [key, stored]);
          await settle('COMMIT');
        }
        flush();
      } catch (error) {
        await settle('ROLLBACK');
        next(error); // nothing committed: the error handler answers 500
      }
    });
    req.db = client;
    next();
  };
}

function answerClaimError(error, res, retryAfter, next) {
  switch (error.code) {
    case SQLSTATE.keyInProgress:
      return sendProblem(res, 409, 'request-in-progress',
        'A request with this Idempotency-Key is still being processed',
        `Retry the same request with the same key after ${retryAfter} s.`,
        { 'Retry-After': String(retryAfter) });
    case SQLSTATE.keyReused:
      return sendProblem(res, 422, 'idempotency-key-reused',
        'Idempotency-Key reused with a different request',
        'This key was used for another request; use a new key for a new request.');
    case SQLSTATE.invalidKey:
      return sendProblem(res, 400, 'invalid-idempotency-key', 'Invalid Idempotency-Key',
        `An Idempotency-Key must be 1 to ${MAX_KEY_BYTES} bytes long.`);
    default:
      return next(error);
  }
}

module.exports = { idempotent, requestHash };
