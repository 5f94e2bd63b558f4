'use strict';
// A message-broker consumer that applies each message once (the inbox
// pattern on a real broker): for every delivery, claim the message's key in
// the consumer's own database transaction, run the handler there, store its
// answer with the key, COMMIT, and only then acknowledge the delivery.
//
// A delivery lost between the commit and the ack comes back (redelivered
// after a crash, a closed channel or a broker restart); its claim replays the
// stored answer instead of running the handler again, and it is acked.
//
//   IK409 (another consumer holds the key right now)  -> requeued after a backoff
//   IK410 (it ran; its answer is no longer kept)      -> acked without running, no reply
//   IK422 (the key was used for another payload)      -> dead-lettered with the reason
//   handler error listed by isStoredError             -> stored as the answer, acked
//   other handler error                               -> retried maxAttempts times, then dead-lettered
//   the database's transient errors (08, 40, 53, 57, 58 classes) -> requeued after a backoff
//   a reply_to on the message                         -> the stored answer (jsonb's text) is published
//                                                        to it with the message's correlation_id
//
// With batchSize > 1, deliveries are gathered into batches (up to batchSize,
// or what arrived within batchWaitMs of the first) and each batch is one
// transaction: one idempotency.claim_batch for every key, the handlers in
// turn, one idempotency.complete_batch, COMMIT, then the replies and acks.
// A handler that fails rolls the batch back; that message is settled as
// above and the rest of the batch runs again without it (a stored error is
// kept as its answer for that run), so one message never costs the others
// their work, and a batch that commits carries no failed handler's writes.
//
// The channel is an amqplib Channel or ConfirmChannel (a ConfirmChannel
// makes every reply, retry and dead letter wait for the broker's confirm
// before the delivery is acked). amqplib itself is not a dependency: any
// object with its consume/ack/nack/publish/sendToQueue methods works.

const { createHash } = require('node:crypto');
const { waitTimeoutSetting, sealable } = require('./pg');
const { MAX_KEY_BYTES } = require('./key');
const {
  KeyInProgressError, KeyGoneError, KeyReusedError, InvalidKeyError, fromClaimError,
} = require('./errors');

const ATTEMPTS_HEADER = 'x-idempotency-attempts';
const REASON_HEADER = 'x-idempotency-reason';
const CODE_HEADER = 'x-idempotency-code';
const REPLAYED_HEADER = 'x-idempotency-replayed';

// The handler's own error, kept apart from the claim's and the database's.
class HandlerFailure extends Error {
  constructor(cause) {
    super(cause && cause.message ? cause.message : String(cause));
    this.cause = cause;
  }
}

const defaultKey = (message) => message.properties.messageId;
const defaultRequestHash = (message) => createHash('sha256').update(message.content).digest('hex');
const defaultParse = (content) => JSON.parse(content.toString('utf8'));

// Exponential backoff with jitter, so consumers that met on one key do not
// meet again in lockstep.
function defaultBackoff(attempt) {
  const ceiling = Math.min(50 * 2 ** attempt, 5000);
  return ceiling / 2 + Math.random() * (ceiling / 2);
}

// The same shape idempotent_call stores for an error listed in
// idempotency.store_errors, so every reader handles both alike.
function errorDocument(error) {
  const field = (name) => (error && error[name] !== undefined && error[name] !== null ? String(error[name]) : null);
  return { error: { sqlstate: field('code'), message: field('message'), detail: field('detail'), hint: field('hint') } };
}

const isErrorDocument = (value) => value !== null && typeof value === 'object' && !Array.isArray(value)
  && Object.keys(value).length === 1 && value.error !== null && typeof value.error === 'object';

const sleep = (ms) => new Promise((resolve) => setTimeout(resolve, ms));

// SQLSTATE classes of errors that say nothing about the message: the
// connection (08), a serialization failure or deadlock (40), resources (53),
// a shutdown (57), the system (58). A handler that meets one is not failing:
// the message is requeued like any other transient failure, its attempts
// not counted.
const TRANSIENT_CLASSES = new Set(['08', '40', '53', '57', '58']);
const isTransient = (error) => typeof error?.code === 'string' && error.code.length === 5
  && TRANSIENT_CLASSES.has(error.code.slice(0, 2));

// A message costs the round trips of a consumer without idempotency (BEGIN,
// the handler's work, COMMIT): BEGIN goes with the claim in one simple-query
// message, and the complete with COMMIT in another. The simple-query
// protocol takes no parameters, so the key, request hash and response go in
// as literals (escapeLiteral). No savepoint guards the handler's work: a
// stored error, the rare case, rolls the transaction back and stores the
// error under a new claim (storeError), so the common case pays for no
// subtransaction.
const literal = (client, value) => (value === null || value === undefined ? 'NULL' : client.escapeLiteral(value));

// jsonb comes back as the server's text of it (jsonb_out's, the bytes every
// replay has), not parsed: the statements select the jsonb itself rather
// than a cast to text, which the server would plan and fold at every call.
// A jsonb[] comes back as an array of those texts.
const JSONB_ARRAY_OID = 3807;
const TEXT_ARRAY_OID = 1009;
const asText = (value) => value;
const textTypes = { getTypeParser: () => asText };
const textArrayTypes = (client) => ({
  getTypeParser: (oid, format) => (oid === JSONB_ARRAY_OID ? client.getTypeParser(TEXT_ARRAY_OID, format) : asText),
});

// The replayed flag and the response's jsonb text from claim()'s row in a
// record's text form: "(f,,,)" for a key claimed now, "(t,<response>,...)"
// for a replay, the response in double quotes (with " and \ doubled) unless
// it has none of the characters that need them.
const CLAIM_RECORD = /^\(([tf]),(?:"((?:[^"\\]|""|\\\\)*)"|([^,]*)),/;
function claimFromRecord(record) {
  const [, replayed, quoted, bare] = CLAIM_RECORD.exec(record);
  const text = quoted !== undefined ? quoted.replace(/""|\\\\/g, (pair) => pair[0]) : (bare || null);
  return { replayed: replayed === 't', text };
}

// BEGIN and the claim, with the stored response as jsonb's text: the reply
// is made of that text, so the first reply and every replay, from any
// client, are the same bytes. claim() is called in the select list, where
// the server plans it for less than as a table in FROM; its row comes back
// as a record's text.
async function beginAndClaim(client, { key, requestHash, waitTimeout }) {
  if (requestHash !== null && requestHash !== undefined && typeof requestHash !== 'string')
    throw new TypeError(`requestHash must give a string, not ${typeof requestHash}`);
  // A literal cannot carry a NUL character, and PostgreSQL's text cannot
  // hold one.
  if (key.includes('\0') || requestHash?.includes('\0'))
    throw new InvalidKeyError('the key or request hash has a NUL character, which PostgreSQL text cannot hold');
  let statements = ['BEGIN'];
  if (waitTimeout !== undefined) {
    // Apart from the claim: a wait timeout the server refuses (22023) is not
    // an invalid key.
    statements.push(`SELECT pg_catalog.set_config('idempotency.wait_timeout', ${
      literal(client, waitTimeoutSetting(waitTimeout))}, true)`);
    await client.query(statements.join('; '));
    statements = [];
  }
  // node-postgres hands a record over as its text (no parser for type
  // record); a cast to text here would cost the server more than the claim's
  // form saves.
  statements.push(`SELECT idempotency.claim(${literal(client, key)}, ${literal(client, requestHash)}) AS claimed`);
  try {
    const results = [await client.query(statements.join('; '))].flat();
    return claimFromRecord(results.find((result) => result.fields[0]?.name === 'claimed').rows[0].claimed);
  } catch (error) {
    throw fromClaimError(error);
  }
}

// Stores the answer and commits; returns the answer as stored: jsonb's text
// (its key order, its spacing).
async function completeAndCommit(client, key, response) {
  const json = response === undefined || response === null ? null : JSON.stringify(response);
  const [{ rows: [stored] }] = await client.query({
    text: `SELECT idempotency.complete(${literal(client, key)}, answer), answer AS text`
      + ` FROM CAST(${literal(client, json)} AS jsonb) AS answer; COMMIT`,
    types: textTypes,
  });
  return stored.text;
}

// The answer of a claim that found the key stored: the transaction ends.
async function replayed(client, claimed) {
  await client.query('COMMIT');
  const response = claimed.text === null ? null : JSON.parse(claimed.text);
  return { outcome: isErrorDocument(response) ? 'replayed_error' : 'replayed', response, text: claimed.text };
}

// The handler's error is the answer: its work is undone with the whole
// transaction, and the error stored under a new claim of the key. Another
// delivery of the key that ran meanwhile makes this a replay of its answer
// (or an IK409 while it runs): the key still gets one answer.
async function storeError(client, { key, requestHash, waitTimeout, beforeCommit }, error) {
  await client.query('ROLLBACK');
  const claimed = await beginAndClaim(client, { key, requestHash, waitTimeout });
  if (claimed.replayed)
    return replayed(client, claimed);
  if (beforeCommit)
    beforeCommit();
  const text = await completeAndCommit(client, key, errorDocument(error));
  return { outcome: 'stored_error', response: JSON.parse(text), text };
}

// Claims key, runs work(db) and stores its answer in one transaction.
// Returns { outcome: 'ran' | 'stored_error' | 'replayed' | 'replayed_error',
// response, text }: the answer as stored, and its jsonb text.
async function applyOnce(pool, { key, requestHash, waitTimeout, isStoredError, beforeCommit }, work) {
  const client = await pool.connect();
  let broken; // a client whose ROLLBACK failed is not given back for reuse
  try {
    const claimed = await beginAndClaim(client, { key, requestHash, waitTimeout });
    if (claimed.replayed)
      return await replayed(client, claimed);
    const handle = sealable(client);
    let response;
    let storedError = null;
    try {
      response = await work(handle.proxy);
    } catch (error) {
      if (isTransient(error))
        throw error;
      if (!isStoredError || !isStoredError(error))
        throw new HandlerFailure(error);
      storedError = error;
    } finally {
      handle.seal(`the transaction of message key ${JSON.stringify(key)} has ended; `
        + 'use the handle only inside the handler');
    }
    if (storedError !== null)
      return await storeError(client, { key, requestHash, waitTimeout, beforeCommit }, storedError);
    if (beforeCommit)
      beforeCommit();
    const text = await completeAndCommit(client, key, response);
    return { outcome: 'ran', response: text === null ? null : JSON.parse(text), text };
  } catch (error) {
    await client.query('ROLLBACK').catch((rollbackError) => { broken = rollbackError; });
    throw error;
  } finally {
    client.release(broken);
  }
}

// An SQL array of values (null or strings) of elementType: one literal of
// the array's text form, each element in double quotes (with " and \
// escaped), cast to the array type. The server reads it with the array's
// input function, for less than a constant per element in ARRAY[...].
const arrayElement = (value) => (value === null || value === undefined
  ? 'NULL' : `"${value.replace(/[\\"]/g, (character) => `\\${character}`)}"`);
const arrayLiteral = (client, values, elementType) => {
  if (values.some((value) => typeof value === 'string' && value.includes('\0')))
    throw new InvalidKeyError('a key or request hash has a NUL character, which PostgreSQL text cannot hold');
  return `CAST(${client.escapeLiteral(`{${values.map(arrayElement).join(',')}}`)} AS ${elementType}[])`;
};

// BEGIN and claim_batch in one message, as a single message's BEGIN goes
// with its claim: the answers of claim_batch, one per key in the order
// given (placed by their ordinality here, for less than an ORDER BY costs
// the server), with the stored response as jsonb's text.
async function beginAndClaimBatch(client, keys, requestHashes, waitTimeout) {
  const statements = ['BEGIN'];
  if (waitTimeout !== undefined)
    statements.push(`SELECT pg_catalog.set_config('idempotency.wait_timeout', ${
      literal(client, waitTimeoutSetting(waitTimeout))}, true)`);
  statements.push('SELECT ordinality, outcome, sqlstate, message, response::text AS text FROM idempotency.claim_batch('
    + `${arrayLiteral(client, keys, 'text')}, ${arrayLiteral(client, requestHashes, 'text')})`);
  const results = await client.query(statements.join('; '));
  const rows = [results].flat().find((result) => result.fields[0]?.name === 'ordinality').rows;
  const ordered = new Array(rows.length);
  for (const row of rows)
    ordered[row.ordinality - 1] = row;
  return ordered;
}

// Stores the answers and commits, in one message; returns the answers as
// stored: jsonb's text (its key order, its spacing).
async function completeBatchAndCommit(client, keys, responses) {
  const answers = arrayLiteral(client, responses.map((response) => (response === undefined || response === null
    ? null : JSON.stringify(response))), 'jsonb');
  const [{ rows: [stored] }] = await client.query({
    text: `SELECT idempotency.complete_batch(${arrayLiteral(client, keys, 'text')}, answers) AS done, answers AS texts`
      + ` FROM ${answers} AS answers; COMMIT`,
    types: textArrayTypes(client),
  });
  return stored.texts;
}

// Applies a batch of deliveries ({ key, requestHash, run(db) }) in one
// transaction. Returns one settlement per item: { outcome, response, text }
// for a committed or replayed answer, or { error } for one to settle like a
// failed single message (a KeyInProgressError, KeyReusedError, other claim
// error, HandlerFailure or transient error). A handler failure rolls the
// whole transaction back and the batch runs again without that item; an
// error of the database or the connection (claim_batch, complete_batch,
// COMMIT) throws, and no item is settled.
async function applyBatch(pool, { waitTimeout, isStoredError, beforeCommit }, items) {
  const settled = new Array(items.length);
  const storedErrors = new Map(); // index -> the error document, kept across runs
  let pending = items.map((item, index) => index);
  while (pending.length > 0) {
    const client = await pool.connect();
    let broken;
    let failed = null; // { index, error } of the handler that ended this run
    const answers = new Map();
    try {
      const rows = await beginAndClaimBatch(client, pending.map((i) => items[i].key),
        pending.map((i) => items[i].requestHash ?? null), waitTimeout);
      const completed = []; // [index, response, outcome]
      for (const [n, index] of pending.entries()) {
        const row = rows[n];
        if (row.outcome === 'replayed') {
          const response = row.text === null ? null : JSON.parse(row.text);
          answers.set(index, { outcome: isErrorDocument(response) ? 'replayed_error' : 'replayed', response, text: row.text });
        } else if (row.outcome === 'refused') {
          answers.set(index, { error: fromClaimError(Object.assign(new Error(row.message), { code: row.sqlstate })) });
        } else if (storedErrors.has(index)) {
          completed.push([index, storedErrors.get(index), 'stored_error']);
        } else {
          const handle = sealable(client);
          try {
            completed.push([index, await items[index].run(handle.proxy), 'ran']);
          } catch (error) {
            failed = { index, error };
            break;
          } finally {
            handle.seal(`the transaction of message key ${JSON.stringify(items[index].key)} has ended; `
              + 'use the handle only inside the handler');
          }
        }
      }
      if (failed === null) {
        if (beforeCommit)
          beforeCommit();
        const texts = await completeBatchAndCommit(client, completed.map(([index]) => items[index].key),
          completed.map(([, response]) => response));
        for (const [n, [index, , outcome]] of completed.entries()) {
          const text = texts[n];
          answers.set(index, { outcome, response: text === null ? null : JSON.parse(text), text });
        }
      } else {
        await client.query('ROLLBACK');
      }
    } catch (error) {
      await client.query('ROLLBACK').catch((rollbackError) => { broken = rollbackError; });
      throw error;
    } finally {
      client.release(broken);
    }
    if (failed === null) {
      for (const [index, answer] of answers)
        settled[index] = answer;
      return settled;
    }
    // The failed handler's message is settled on its own; the others run again.
    const { index, error } = failed;
    if (!isTransient(error) && isStoredError && isStoredError(error)) {
      storedErrors.set(index, errorDocument(error));
      continue;
    }
    settled[index] = { error: isTransient(error) ? error : new HandlerFailure(error) };
    pending = pending.filter((i) => i !== index);
  }
  return settled;
}

// Resolves once the broker confirmed what the channel published (at once on
// a channel without confirms).
async function confirmed(channel) {
  if (typeof channel.waitForConfirms === 'function')
    await channel.waitForConfirms();
}

function checkOptions(options) {
  for (const name of ['channel', 'queue', 'pool', 'handler'])
    if (!options[name])
      throw new TypeError(`consume(options): options.${name} is required`);
  if (typeof options.handler !== 'function')
    throw new TypeError('consume(options): options.handler must be a function (db, payload, message) => answer');
  const maxAttempts = options.maxAttempts ?? 5;
  if (!Number.isInteger(maxAttempts) || maxAttempts < 1)
    throw new RangeError(`maxAttempts must be a whole number >= 1, not ${maxAttempts}`);
  const batchSize = options.batchSize ?? 1;
  if (!Number.isInteger(batchSize) || batchSize < 1)
    throw new RangeError(`batchSize must be a whole number >= 1, not ${batchSize}`);
  const batchWaitMs = options.batchWaitMs ?? 10;
  if (typeof batchWaitMs !== 'number' || !(batchWaitMs >= 0))
    throw new RangeError(`batchWaitMs must be a number of milliseconds >= 0, not ${batchWaitMs}`);
  if (options.deadLetter && typeof options.deadLetter.routingKey !== 'string')
    throw new TypeError('deadLetter must be { exchange?, routingKey }');
}

// Starts consuming queue. Returns { consumerTag, cancel() }; cancel stops new
// deliveries (those in flight finish).
async function consume(options) {
  checkOptions(options);
  const {
    channel, queue, pool, handler, deadLetter = null, waitTimeout, isStoredError = null,
    key: keyOf = defaultKey, requestHash: requestHashOf = defaultRequestHash, parse = defaultParse,
    backoff = defaultBackoff, maxAttempts = 5, onEvent = () => {}, consumerTag,
    batchSize = 1, batchWaitMs = 10,
  } = options;
  const inProgressAttempts = new Map(); // key -> IK409s met in a row, for the backoff

  const emit = (type, message, extra) => onEvent({ type, message, ...extra });

  function publishCopy(exchange, routingKey, message, headers) {
    const { properties } = message;
    channel.publish(exchange, routingKey, message.content, {
      ...properties,
      persistent: properties.deliveryMode === undefined ? true : properties.deliveryMode === 2,
      deliveryMode: undefined,
      headers: { ...(properties.headers || {}), ...headers },
    });
  }

  async function deadLetterMessage(message, code, reason) {
    if (deadLetter) {
      publishCopy(deadLetter.exchange ?? '', deadLetter.routingKey, message,
        { [REASON_HEADER]: reason, [CODE_HEADER]: code, 'x-original-queue': queue });
      await confirmed(channel);
      channel.ack(message);
    } else {
      // The queue's own dead-letter exchange, if any, gets it (x-death says 'rejected').
      channel.nack(message, false, false);
    }
    emit('dead-lettered', message, { code, reason });
  }

  // Publishes the answer to the message's reply_to, if it has one; true
  // when it did (the broker's confirm is still to come).
  function publishReply(message, text, outcome) {
    const { replyTo, correlationId } = message.properties;
    if (!replyTo)
      return false;
    channel.sendToQueue(replyTo, Buffer.from(text ?? 'null'), {
      correlationId, contentType: 'application/json', persistent: true,
      headers: { [REPLAYED_HEADER]: outcome === 'replayed' || outcome === 'replayed_error' },
    });
    return true;
  }

  async function retryLater(message, key, error) {
    // The handler failed and rolled back: the message goes to the back of
    // the queue with its attempt counted, then this delivery is acked.
    const attempts = Number(message.properties.headers?.[ATTEMPTS_HEADER] ?? 0) + 1;
    if (attempts >= maxAttempts) {
      await deadLetterMessage(message, 'handler-error',
        `the handler failed ${attempts} times; last error: ${error.message}`);
      return;
    }
    await sleep(backoff(attempts));
    publishCopy('', queue, message, { [ATTEMPTS_HEADER]: attempts });
    await confirmed(channel);
    channel.ack(message);
    emit('retried', message, { key, attempts, error });
  }

  async function requeueLater(message, key, error) {
    const attempts = (inProgressAttempts.get(key) ?? 0) + 1;
    inProgressAttempts.set(key, attempts);
    await sleep(backoff(attempts));
    channel.nack(message, false, true);
    emit('requeued', message, { key, attempts, error });
  }

  // The delivery's payload and key, or null when it was dead-lettered for
  // having neither or a key no claim accepts.
  async function prepare(message) {
    emit('delivered', message, { redelivered: message.fields.redelivered });
    let payload;
    let key;
    try {
      payload = parse(message.content, message);
      key = keyOf(message, payload);
    } catch (error) {
      await deadLetterMessage(message, 'unparsable', `the payload could not be parsed: ${error.message}`);
      return null;
    }
    if (typeof key !== 'string' || key === '') {
      await deadLetterMessage(message, 'no-key', 'the message has no key (message id or business id)');
      return null;
    }
    // What the claim would refuse, refused here: in a batch, a key the
    // server refuses would end claim_batch for every message.
    if (Buffer.byteLength(key, 'utf8') > MAX_KEY_BYTES || key.includes('\0')) {
      await deadLetterMessage(message, 'invalid-key',
        `the message key is longer than ${MAX_KEY_BYTES} bytes or has a NUL character`);
      return null;
    }
    return {
      message, key, requestHash: requestHashOf(message, payload),
      run: (db) => handler(db, payload, message),
    };
  }

  // After the commit (of one message, or of a batch): every reply
  // published, then one wait for the broker's confirms of them all, then
  // the acks. (A wait per reply would make each wait again for the replies
  // published before it.)
  async function settleAnswers(answers) {
    const replied = [];
    for (const { message, key, answer } of answers) {
      inProgressAttempts.delete(key);
      emit('committed', message, { key, outcome: answer.outcome, response: answer.response });
      if (publishReply(message, answer.text, answer.outcome))
        replied.push({ message, answer });
    }
    if (replied.length > 0) {
      await confirmed(channel);
      for (const { message, answer } of replied)
        emit('replied', message, { response: answer.response, outcome: answer.outcome });
    }
    for (const settling of answers) {
      channel.ack(settling.message);
      settling.acked = true;
      emit('acked', settling.message, { key: settling.key, outcome: settling.answer.outcome });
    }
  }

  async function onMessage(message) {
    if (message === null) { // the broker cancelled the consumer (queue deleted)
      emit('cancelled', null, {});
      return;
    }
    let key;
    try {
      const item = await prepare(message);
      if (item === null)
        return;
      key = item.key;
      const answer = await applyOnce(pool, {
        key, requestHash: item.requestHash, waitTimeout, isStoredError,
        beforeCommit: () => emit('committing', message, { key }),
      }, item.run);
      await settleAnswers([{ message, key, answer }]);
    } catch (error) {
      await settleFailure(message, key, error);
    }
  }

  // Batch mode: deliveries gather in `gathered` until batchSize of them or
  // batchWaitMs after the first; one batch runs at a time.
  let gathered = [];
  let timer = null;
  let running = Promise.resolve();

  async function runBatch(messages) {
    const items = [];
    for (const message of messages) {
      try {
        const item = await prepare(message);
        if (item !== null)
          items.push(item);
      } catch (error) {
        await settleFailure(message, undefined, error);
      }
    }
    if (items.length === 0)
      return;
    let settled;
    try {
      settled = await applyBatch(pool, {
        waitTimeout, isStoredError,
        beforeCommit: () => { for (const { message, key } of items) emit('committing', message, { key }); },
      }, items);
    } catch (error) { // the database or the connection: every delivery comes back later
      await Promise.all(items.map(({ message, key }) => settleFailure(message, key, error)));
      return;
    }
    const answers = [];
    const failures = [];
    for (const [index, { message, key }] of items.entries()) {
      if (settled[index].error)
        failures.push(settleFailure(message, key, settled[index].error));
      else
        answers.push({ message, key, answer: settled[index] });
    }
    try {
      await settleAnswers(answers);
    } catch (error) { // the channel: those not acked come back, and replay
      await Promise.all(answers.filter(({ acked }) => !acked)
        .map(({ message, key }) => settleFailure(message, key, error)));
    }
    await Promise.all(failures);
  }

  function flush() {
    clearTimeout(timer);
    timer = null;
    const messages = gathered;
    gathered = [];
    running = running.then(() => runBatch(messages))
      .catch((error) => emit('error', null, { error }));
  }

  function onBatchMessage(message) {
    if (message === null) {
      emit('cancelled', null, {});
      return;
    }
    gathered.push(message);
    if (gathered.length >= batchSize)
      flush();
    else if (timer === null)
      timer = setTimeout(flush, batchWaitMs);
  }

  // The message was applied before and its answer has expired (IK410): a
  // duplicate, acked as done. No answer is kept, so none is replied.
  function settleGone(message, key) {
    inProgressAttempts.delete(key);
    channel.ack(message);
    emit('acked', message, { key, outcome: 'gone' });
  }

  async function settleFailure(message, key, error) {
    try {
      if (error instanceof KeyInProgressError)
        await requeueLater(message, key, error);
      else if (error instanceof KeyGoneError)
        settleGone(message, key);
      else if (error instanceof KeyReusedError)
        await deadLetterMessage(message, 'IK422', error.message);
      else if (error instanceof InvalidKeyError) // no redelivery makes the key valid
        await deadLetterMessage(message, 'invalid-key', error.message);
      else if (error instanceof HandlerFailure)
        await retryLater(message, key, error.cause);
      else // the database or the channel: the delivery comes back later
        await requeueLater(message, key, error);
    } catch (settleError) {
      // The channel is gone: the broker redelivers the message to another
      // consumer; its key makes that a replay if the work had committed.
      emit('error', message, { key, error: settleError });
    }
  }

  const batched = batchSize > 1;
  // A batch can only fill when the broker may send that many unacked
  // deliveries; twice that lets the next batch gather while one commits.
  if (batched && typeof channel.prefetch === 'function')
    await channel.prefetch(2 * batchSize);
  const { consumerTag: tag } = await channel.consume(queue,
    batched ? onBatchMessage : (message) => { onMessage(message); },
    { noAck: false, ...(consumerTag ? { consumerTag } : {}) });
  return {
    consumerTag: tag,
    cancel: () => channel.cancel(tag),
  };
}

module.exports = {
  consume, applyOnce, applyBatch, errorDocument, isErrorDocument, defaultBackoff, HandlerFailure,
  ATTEMPTS_HEADER, REASON_HEADER, CODE_HEADER, REPLAYED_HEADER,
};
