'use strict';
// Express (or plain Node http) route wrapper: makes a handler safe to retry
// with an Idempotency-Key header.
//
//   app.post('/charges', express.json(), idempotent({ pool, scope: (req) => req.user.id }, async (req, res) => {
//     await req.db.query('INSERT INTO charges ...');   // the request's transaction
//     res.status(201).json(receipt);
//   }));
//
// scope names the request's principal (the user, API client or tenant it
// comes from): each principal's keys are its own (lib/scope.js). It is
// required; scope: SHARED_KEYS makes the route's keys shared by every
// client. A request whose scope is null, undefined or '', or whose scope
// function throws a TypeError (req.user.id without a user), is refused with
// 401 principal-required; any other error is the request's error.
//
// pool is a pg.Pool, or a function of the request that returns one (a pool
// made once the application has started: (req) => req.app.locals.pool).
// ttl gives the request's key its TTL (SET LOCAL before the claim), and
// onEvent gets each keyed request's outcome (lib/events.js).
//
// For a request with a key, the wrapper opens a transaction on a pool
// client, claims the key, and runs the handler with the transaction as
// req.db. It holds back what the handler sends; once the handler has both
// ended its response and returned without throwing, it stores the response
// (when the storing policy says so) and commits, then sends it. A handler
// that throws, rejects or calls next(error) never commits: the transaction
// rolls back and the error goes to Express's error handlers, whose answer is
// not stored. req.db is sealed when the handler ends its response: any use
// after that throws SealedError.

const { readKey } = require('./key');
const { requestFingerprint } = require('./fingerprint');
const { notStoredReason, DEFAULT_VALIDATION_STATUSES } = require('./policy');
const { storedDocument, decodeBody } = require('./stored');
const { claim, complete, sealable, waitTimeoutSetting, ttlSetting } = require('./pg');
const { SHARED_KEYS, scopedKey, scopeText } = require('./scope');
const { KeyInProgressError, KeyGoneError, KeyReusedError, InvalidKeyError } = require('./errors');
const { outcomeEvent, debugEvent } = require('./events');

// Problem types a client can rely on whatever host serves the API: a URN
// needs none. problemBase replaces it per route (share one options object
// across an application's routes).
const DEFAULT_PROBLEM_BASE = 'urn:idempotency:problem:';

const DEFAULTS = Object.freeze({
  required: true,
  replayHeaders: ['Location', 'ETag'],
  retryAfter: 1,
  storeValidationErrors: false,
  validationStatuses: DEFAULT_VALIDATION_STATUSES,
  waitTimeout: undefined,
  ttl: undefined,
  maxBodyBytes: 1024 * 1024,
  maxRequestBytes: 1024 * 1024,
  problemBase: DEFAULT_PROBLEM_BASE,
  property: 'db',
  onEvent: debugEvent,
  onLateError: (error) => console.error('idempotency-pg: error after the response was settled:', error),
});

// Hands an outcome to the route's onEvent; a hook that throws must not
// change the answer.
function report(settings, req, event, details) {
  try {
    settings.onEvent(outcomeEvent(req, event, details), req);
  } catch (error) {
    settings.onLateError(error, req);
  }
}

const CLAIM_OUTCOMES = new Map([
  [KeyInProgressError, 'conflict'], [KeyGoneError, 'gone'], [KeyReusedError, 'mismatch'],
  [InvalidKeyError, 'invalid-key'],
]);

function sendProblem(res, settings, status, type, title, detail, headers = {}) {
  const body = Buffer.from(JSON.stringify({ type: settings.problemBase + type, title, status, detail }));
  res.statusCode = status;
  for (const [name, value] of Object.entries(headers))
    res.setHeader(name, value);
  res.setHeader('Content-Type', 'application/problem+json');
  res.setHeader('Content-Length', body.length);
  res.end(body);
}

function answerClaimError(error, res, settings, next) {
  if (error instanceof KeyInProgressError)
    return sendProblem(res, settings, 409, 'request-in-progress',
      'A request with this Idempotency-Key is still being processed',
      `Retry the same request with the same key after ${settings.retryAfter} s.`,
      { 'Retry-After': String(settings.retryAfter) });
  if (error instanceof KeyGoneError)
    return sendProblem(res, settings, 410, 'request-already-ran',
      'This request already ran; its response is no longer kept',
      'A request with this Idempotency-Key was processed before and its response has expired; '
      + 'it is not run again.');
  if (error instanceof KeyReusedError)
    return sendProblem(res, settings, 422, 'idempotency-key-reused',
      'Idempotency-Key reused with a different request',
      'This key was used for another request; use a new key for a new request.');
  if (error instanceof InvalidKeyError)
    return sendProblem(res, settings, 400, 'invalid-idempotency-key', 'Invalid Idempotency-Key', error.message);
  return next(error);
}

// Sends a stored response again, byte for byte.
function replay(res, document) {
  if (document === null || typeof document !== 'object' || !Number.isInteger(document.status))
    throw new TypeError('the stored response of this key is not an HTTP response document');
  res.statusCode = document.status;
  for (const [name, value] of Object.entries(document.headers ?? {}))
    res.setHeader(name, value);
  res.setHeader('Idempotent-Replayed', 'true');
  res.end(decodeBody(document));
}

// The headers stored with a response: Content-Type and the replayable ones,
// under the names the application wrote.
function replayableHeaders(res, wanted) {
  const headers = {};
  for (const name of res.getRawHeaderNames()) {
    if (!wanted.has(name.toLowerCase()))
      continue;
    const value = res.getHeader(name);
    headers[name] = Array.isArray(value) ? value.map(String) : String(value);
  }
  return headers;
}

// Holds back everything the handler writes. onEnd({ status, body, callback })
// is called when the handler ends the response; onOverflow() when the body
// grows past maxBodyBytes (what follows is dropped). release() puts the real
// methods back.
function captureResponse(res, maxBodyBytes, { onEnd, onOverflow }) {
  const real = { write: res.write, end: res.end, writeHead: res.writeHead, flushHeaders: res.flushHeaders };
  const chunks = [];
  let size = 0;
  let state = 'open'; // then 'ended' or 'overflowed'

  const collect = (chunk, encoding) => {
    if (chunk === undefined || chunk === null || typeof chunk === 'function')
      return;
    const bytes = typeof chunk === 'string'
      ? Buffer.from(chunk, typeof encoding === 'string' ? encoding : 'utf8')
      : Buffer.from(chunk);
    size += bytes.length;
    if (size > maxBodyBytes) {
      state = 'overflowed';
      chunks.length = 0;
      onOverflow();
      return;
    }
    chunks.push(bytes);
  };
  const callLater = (callback) => {
    if (typeof callback === 'function')
      process.nextTick(callback);
  };

  res.write = function write(chunk, encoding, callback) {
    if (state === 'open')
      collect(chunk, encoding);
    callLater(typeof encoding === 'function' ? encoding : callback);
    return true;
  };
  res.end = function end(chunk, encoding, callback) {
    if (typeof chunk === 'function') {
      callback = chunk;
      chunk = undefined;
    } else if (typeof encoding === 'function') {
      callback = encoding;
      encoding = undefined;
    }
    if (state === 'open')
      collect(chunk, encoding);
    if (state === 'open') {
      state = 'ended';
      onEnd({ status: res.statusCode, body: Buffer.concat(chunks), callback });
    }
    return res;
  };
  res.writeHead = function writeHead(status, reason, headers) {
    if (typeof reason === 'string')
      res.statusMessage = reason;
    else
      headers = reason;
    res.statusCode = status;
    if (Array.isArray(headers)) {
      for (let i = 0; i + 1 < headers.length; i += 2)
        res.setHeader(headers[i], headers[i + 1]);
    } else if (headers) {
      for (const [name, value] of Object.entries(headers))
        res.setHeader(name, value);
    }
    return res;
  };
  res.flushHeaders = function flushHeaders() {};

  return {
    release() {
      Object.assign(res, real);
    },
  };
}

// The headers earlier middleware set (CORS, say), to go back to when what
// the handler set must not reach the client.
function headerSnapshot(res) {
  const snapshot = res.getRawHeaderNames().map((name) => [name, res.getHeader(name)]);
  return function restore() {
    for (const name of res.getHeaderNames())
      res.removeHeader(name);
    for (const [name, value] of snapshot)
      res.setHeader(name, value);
    res.statusCode = 200;
  };
}

// A request whose body no parser read (none ran, or one that skipped it):
// the wrapper reads it, as express.raw() would, for the fingerprint.
function bodyUnread(req) {
  if (req._body === true || req.readableEnded || Buffer.isBuffer(req.rawBody))
    return false;
  const body = req.body;
  return body === undefined
    || (body !== null && typeof body === 'object' && !Buffer.isBuffer(body)
      && Object.getPrototypeOf(body) === Object.prototype && Object.keys(body).length === 0);
}

async function readBody(req, limit) {
  const chunks = [];
  let size = 0;
  for await (const chunk of req) {
    size += chunk.length;
    if (size > limit)
      return null;
    chunks.push(chunk);
  }
  return Buffer.concat(chunks);
}

// One request's transaction on a pool client: ends once, gives the client
// back (discarding it when ROLLBACK failed); a failed COMMIT throws.
function requestTransaction(client) {
  let ended = false;
  return {
    client,
    async end(command) {
      if (ended)
        return;
      ended = true;
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
    },
  };
}

function settingsOf(options) {
  if (options === null || typeof options !== 'object')
    throw new TypeError('idempotent(options, handler): options must be an object with a pool');
  // An option given as undefined takes its default.
  const given = Object.fromEntries(Object.entries(options).filter(([, value]) => value !== undefined));
  const settings = { ...DEFAULTS, ...given };
  if (!settings.pool || (typeof settings.pool.connect !== 'function' && typeof settings.pool !== 'function'))
    throw new TypeError('idempotent(options, handler): options.pool must be a pg.Pool, '
      + 'or a function of the request returning one, as in pool: (req) => req.app.locals.pool');
  if (settings.scope !== SHARED_KEYS && typeof settings.scope !== 'function')
    throw new TypeError('idempotent(options, handler): options.scope must name the principal of a request, '
      + 'as in scope: (req) => req.user.id, so that one client\'s keys never reach another\'s responses; '
      + 'scope: SHARED_KEYS shares the route\'s keys between every client');
  // Checked now, not at the first request.
  if (settings.waitTimeout !== undefined)
    waitTimeoutSetting(settings.waitTimeout);
  if (settings.ttl !== undefined)
    ttlSetting(settings.ttl);
  if (typeof settings.onEvent !== 'function')
    throw new TypeError('idempotent(options, handler): options.onEvent must be a function (event, req) => void');
  settings.storedHeaderNames = new Set(['content-type', ...settings.replayHeaders.map((name) => name.toLowerCase())]);
  return settings;
}

function idempotent(options, handler) {
  if (typeof handler !== 'function')
    throw new TypeError('idempotent(options, handler): pass the route handler to wrap as the second argument');
  const settings = settingsOf(options);
  return function idempotentRoute(req, res, next) {
    handleRequest(settings, handler, req, res, next).catch(next);
  };
}

// The pool of this request: options.pool, or what options.pool(req) returns.
async function poolOf(settings, req) {
  if (typeof settings.pool.connect === 'function')
    return settings.pool;
  const pool = await settings.pool(req);
  if (!pool || typeof pool.connect !== 'function')
    throw new TypeError(`idempotent(): options.pool(req) returned ${pool === null ? 'null' : typeof pool}, `
      + 'not a pg.Pool: is the pool made yet?');
  return pool;
}

// The request's scope as text, or null, with the error when the scope
// function threw a TypeError: (req) => req.user.id throws one when no user
// was authenticated, and that request has no principal. Any other error (a
// lookup that failed) is a fault, not an answer about the client: it goes
// on to the error handlers.
async function principalOf(settings, req) {
  let scope;
  try {
    scope = await settings.scope(req);
  } catch (error) {
    if (error instanceof TypeError)
      return { scope: null, error };
    throw error;
  }
  return { scope: scopeText(scope) };
}

async function handleRequest(settings, handler, req, res, next) {
  const read = readKey(req);
  if (read.error !== undefined) {
    report(settings, req, 'invalid-key', { status: 400, reason: read.error });
    return sendProblem(res, settings, 400, 'invalid-idempotency-key', 'Invalid Idempotency-Key', read.error);
  }
  if (read.missing && settings.required) {
    report(settings, req, 'invalid-key', { status: 400, reason: 'no Idempotency-Key header' });
    return sendProblem(res, settings, 400, 'missing-idempotency-key', 'Missing Idempotency-Key header',
      'Send a unique Idempotency-Key with this request and repeat it on retries.');
  }
  const key = read.key;
  let databaseKey = key;
  let scope = null;
  if (key !== undefined && settings.scope !== SHARED_KEYS) {
    const principal = await principalOf(settings, req);
    scope = principal.scope;
    if (scope === null) {
      report(settings, req, 'principal-required', { status: 401, error: principal.error });
      return sendProblem(res, settings, 401, 'principal-required', 'Request without a principal',
        'This route keeps the Idempotency-Keys of each client apart and could not tell who sent this request.');
    }
    databaseKey = scopedKey(scope, key);
  }

  if (bodyUnread(req)) {
    const body = await readBody(req, settings.maxRequestBytes);
    if (body === null)
      return sendProblem(res, settings, 413, 'request-too-large', 'Request body too large',
        `A request to this route may have at most ${settings.maxRequestBytes} bytes of body.`);
    req.rawBody = body;
    req.body = body;
  }
  const requestHash = requestFingerprint(req);

  const pool = await poolOf(settings, req);
  const transaction = requestTransaction(await pool.connect());
  try {
    await transaction.client.query('BEGIN');
    if (key !== undefined) {
      const claimed = await claim(transaction.client, databaseKey, requestHash,
        { waitTimeout: settings.waitTimeout, ttl: settings.ttl });
      if (claimed.replayed) {
        await transaction.end('COMMIT');
        replay(res, claimed.response);
        return report(settings, req, 'replayed', { databaseKey, status: claimed.response.status });
      }
    }
  } catch (error) {
    await transaction.end('ROLLBACK');
    const outcome = CLAIM_OUTCOMES.get(error?.constructor);
    if (outcome !== undefined)
      report(settings, req, outcome, { databaseKey, status: error.status });
    return answerClaimError(error, res, settings, next);
  }
  req.idempotency = { key, scope, databaseKey, requestHash };
  runHandler(settings, handler, req, res, next, transaction, databaseKey);
}

function runHandler(settings, handler, req, res, next, transaction, key) {
  const handle = sealable(transaction.client);
  const notStored = (reason, status) => {
    if (key !== undefined)
      report(settings, req, 'not-stored', { databaseKey: key, status, reason });
  };
  const clearResponse = headerSnapshot(res);
  let answer = null; // what the handler ended its response with
  let handlerReturned = false;
  let decided = false; // the transaction's outcome is chosen

  const decide = () => {
    if (decided)
      return false;
    decided = true;
    handle.seal(`req.${settings.property} was used after the response was settled: the request's `
      + 'transaction ends with its response. Do the work before answering.');
    return true;
  };

  // The handler failed: nothing commits, the error handlers answer.
  const fail = (error) => {
    if (!decide())
      return settings.onLateError(error, req);
    capture.release();
    clearResponse();
    notStored('handler-error');
    transaction.end('ROLLBACK').finally(() => next(error));
  };

  // The handler ended its response and returned: store and commit, or roll
  // back, as the policy says; then send.
  const finish = async () => {
    if (!decide())
      return;
    const reason = notStoredReason(answer.status, settings);
    const stored = reason === null;
    try {
      if (stored && key !== undefined) {
        await complete(transaction.client, key,
          storedDocument(answer.status, replayableHeaders(res, settings.storedHeaderNames), answer.body));
      }
      await transaction.end(stored ? 'COMMIT' : 'ROLLBACK');
    } catch (error) {
      await transaction.end('ROLLBACK');
      capture.release();
      clearResponse();
      notStored('storing-failed', answer.status);
      return next(error);
    }
    if (stored && key !== undefined)
      report(settings, req, 'stored', { databaseKey: key, status: answer.status });
    else
      notStored(reason, answer.status);
    capture.release();
    res.end(answer.body, answer.callback);
  };

  const capture = captureResponse(res, settings.maxBodyBytes, {
    onEnd(ended) {
      answer = ended;
      handle.seal(`req.${settings.property} was used after the response was sent (status ${ended.status}): `
        + "the request's transaction ends with its response. Do the work before answering.");
      if (handlerReturned)
        finish().catch((error) => settings.onLateError(error, req));
    },
    onOverflow() {
      if (!decide())
        return;
      notStored('response-too-large', 500);
      transaction.end('ROLLBACK').finally(() => {
        capture.release();
        clearResponse();
        sendProblem(res, settings, 500, 'response-too-large', 'Response too large to store',
          `The response is larger than ${settings.maxBodyBytes} bytes and cannot be stored for replay; `
          + 'nothing was committed.');
        // What the handler still writes goes nowhere.
        res.write = () => true;
        res.end = () => res;
      });
    },
  });

  req[settings.property] = handle.proxy;
  const handlerNext = (error) => {
    if (error !== undefined && error !== 'route' && error !== 'router')
      return fail(error);
    // Falls through to another route: it does not run in this transaction.
    if (!decide())
      return undefined;
    capture.release();
    notStored('passed-on');
    return transaction.end('ROLLBACK').finally(() => next(error));
  };

  let returned;
  try {
    returned = handler(req, res, handlerNext);
  } catch (error) {
    return fail(error);
  }
  Promise.resolve(returned).then(() => {
    handlerReturned = true;
    if (answer !== null)
      finish().catch((error) => settings.onLateError(error, req));
  }, fail);
}

module.exports = { idempotent, replay, DEFAULTS, DEFAULT_PROBLEM_BASE };
