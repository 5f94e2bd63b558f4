'use strict';
// node-postgres helpers for handler code and queue consumers: claim,
// complete and release a key in the caller's transaction, and
// withIdempotency, which runs a unit of work once per key in a transaction
// of its own.

const { fromClaimError, SealedError } = require('./errors');

// idempotency.wait_timeout takes milliseconds or a text with a unit ('2s').
function waitTimeoutSetting(waitTimeout) {
  if (typeof waitTimeout === 'number') {
    if (!Number.isInteger(waitTimeout) || waitTimeout < 0)
      throw new RangeError(`waitTimeout must be a whole number of milliseconds >= 0, not ${waitTimeout}`);
    return String(waitTimeout);
  }
  if (typeof waitTimeout === 'string' && waitTimeout.trim() !== '')
    return waitTimeout;
  throw new TypeError('waitTimeout must be milliseconds (a number) or a text such as "2s"');
}

// Sets idempotency.wait_timeout for the rest of the transaction (what SET
// LOCAL does; SET LOCAL cannot take a parameter).
async function setWaitTimeout(client, waitTimeout) {
  await client.query("SELECT set_config('idempotency.wait_timeout', $1, true)",
    [waitTimeoutSetting(waitTimeout)]);
}

// idempotency.ttl takes an interval's text ('15 minutes', '7 days', 'P1D');
// a number is whole milliseconds. The database checks the text when it is
// set (22023: not an interval, not positive, over idempotency.max_ttl).
function ttlSetting(ttl) {
  if (typeof ttl === 'number') {
    if (!Number.isSafeInteger(ttl) || ttl <= 0)
      throw new RangeError(`ttl must be a whole number of milliseconds > 0, not ${ttl}`);
    return `${ttl} milliseconds`;
  }
  if (typeof ttl === 'string' && ttl.trim() !== '')
    return ttl;
  throw new TypeError('ttl must be milliseconds (a number) or an interval\'s text such as "15 minutes"');
}

// Sets idempotency.ttl for the rest of the transaction: the keys it claims
// from now on are kept that long.
async function setTtl(client, ttl) {
  await client.query("SELECT pg_catalog.set_config('idempotency.ttl', $1, true)", [ttlSetting(ttl)]);
}

// Claims key in the client's open transaction. Returns { replayed,
// response, createdAt, expiresAt }; throws KeyInProgressError (IK409),
// KeyGoneError (IK410), KeyReusedError (IK422) or InvalidKeyError for the
// claim's own errors. ttl, when given, is the key's TTL (setTtl).
async function claim(client, key, requestHash, { waitTimeout, ttl } = {}) {
  // Outside the try: a bad setting's 22023 is not an invalid key.
  if (waitTimeout !== undefined)
    await setWaitTimeout(client, waitTimeout);
  if (ttl !== undefined)
    await setTtl(client, ttl);
  try {
    const { rows: [row] } = await client.query(
      'SELECT replayed, response, created_at, expires_at FROM idempotency.claim($1, $2)',
      [key, requestHash ?? null]);
    return { replayed: row.replayed, response: row.response, createdAt: row.created_at, expiresAt: row.expires_at };
  } catch (error) {
    throw fromClaimError(error);
  }
}

// Stores response (any JSON value) for the key this transaction claimed.
async function complete(client, key, response) {
  await client.query('SELECT idempotency.complete($1, $2::jsonb)',
    [key, response === undefined ? null : JSON.stringify(response)]);
}

// Lets go of this transaction's claim without storing anything.
async function release(client, key) {
  await client.query('SELECT idempotency.release($1)', [key]);
}

// A stand-in for a client that forwards to it until seal(reason); then
// every use throws SealedError. Nothing reaching the stand-in can release
// the client either: its owner does.
function sealable(client) {
  let sealedBecause = null;
  const proxy = new Proxy(client, {
    get(target, property) {
      if (sealedBecause !== null)
        throw new SealedError(sealedBecause);
      if (property === 'release')
        throw new TypeError('the transaction handle belongs to idempotency-pg, which releases it');
      const value = Reflect.get(target, property, target);
      return typeof value === 'function' ? value.bind(target) : value;
    },
  });
  return { proxy, seal: (reason) => { sealedBecause = reason; } };
}

const isPool = (db) => typeof db.connect === 'function' && 'totalCount' in db;

// Runs work(db) once for key: in a transaction, after a claim; its result
// (a JSON value) is stored and committed with its work, and returned. A
// retry gets the stored result without running work. Throws what work
// throws (after ROLLBACK), and the claim's errors.
//   db: a pg.Pool (a client is taken and given back) or a connected
//       pg.Client outside any transaction.
// Returns { replayed, response }.
async function withIdempotency(db, { key, requestHash = null, waitTimeout, ttl } = {}, work) {
  if (typeof work !== 'function')
    throw new TypeError('withIdempotency(db, { key, requestHash }, work): work must be a function');
  const client = isPool(db) ? await db.connect() : db;
  let broken; // a client whose ROLLBACK failed is not given back for reuse
  try {
    await client.query('BEGIN');
    const claimed = await claim(client, key, requestHash, { waitTimeout, ttl });
    if (claimed.replayed) {
      await client.query('COMMIT');
      return { replayed: true, response: claimed.response };
    }
    const handle = sealable(client);
    let response;
    try {
      response = await work(handle.proxy);
    } finally {
      handle.seal(`the transaction of idempotency key ${JSON.stringify(key)} has ended; `
        + 'use the handle only inside the work function');
    }
    await complete(client, key, response);
    await client.query('COMMIT');
    return { replayed: false, response: response === undefined ? null : response };
  } catch (error) {
    await client.query('ROLLBACK').catch((rollbackError) => { broken = rollbackError; });
    throw error;
  } finally {
    if (isPool(db))
      client.release(broken);
  }
}

module.exports = {
  claim, complete, release, setWaitTimeout, waitTimeoutSetting, setTtl, ttlSetting, withIdempotency, sealable,
};
