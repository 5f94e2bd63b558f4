'use strict';
// The checker of a run, per message id:
//   - the effect is applied exactly once (one ledger row; none for refused
//     and poison messages), and for a conflict with one of its two payloads;
//   - the stored answer is there (refused: an error document) and every reply
//     that came back for the id is it, byte for byte;
//   - every message ended acked or dead-lettered: the queue is empty, poison
//     messages and the losing copy of a conflict are in the dead-letter queue
//     with a code and a reason, and nothing else is.
// Returns a list of violations (empty: the run is right).

const { isDeepStrictEqual } = require('node:util');

async function check(db, messages, replies, deadLetters, { queueDepth }) {
  const violations = [];
  const flag = (id, what) => violations.push(`${id}: ${what}`);
  const byId = new Map();
  for (const message of messages) {
    if (!byId.has(message.id))
      byId.set(message.id, { kind: message.kind, payloads: [] });
    byId.get(message.id).payloads.push(message.payload);
  }
  const ids = [...byId.keys()];

  const effects = new Map();
  const { rows: ledger } = await db.query(
    'SELECT message_id, count(*)::int AS n, array_agg(amount::int) AS amounts FROM public.ledger GROUP BY message_id');
  for (const row of ledger)
    effects.set(row.message_id, row);
  const stored = new Map();
  const { rows: keys } = await db.query(
    'SELECT k AS id, l.state, l.response, l.response::text AS text FROM unnest($1::text[]) k, '
    + 'LATERAL idempotency.lookup(k) l', [ids]);
  for (const row of keys)
    stored.set(row.id, row);
  const letters = new Map();
  for (const letter of deadLetters) {
    if (!letter.code || !letter.reason)
      flag(letter.id, `dead-lettered without a code and reason (${JSON.stringify(letter)})`);
    if (!letters.has(letter.id))
      letters.set(letter.id, []);
    letters.get(letter.id).push(letter);
  }

  for (const [id, { kind, payloads }] of byId) {
    const effect = effects.get(id);
    const applied = effect ? effect.n : 0;
    const key = stored.get(id);
    const dead = letters.get(id) || [];
    if (kind === 'refused' || kind === 'poison') {
      if (applied !== 0) flag(id, `${kind} message applied ${applied} times`);
    } else if (applied !== 1) {
      flag(id, `applied ${applied} times, not once`);
    } else if (!payloads.some((payload) => payload.amount === effect.amounts[0])) {
      flag(id, `applied with amount ${effect.amounts[0]}, which no copy carried`);
    }
    if (kind === 'poison') {
      if (key.state !== 'absent') flag(id, `poison message has a stored answer (${key.state})`);
      if (!dead.some((letter) => letter.code === 'handler-error'))
        flag(id, 'poison message not dead-lettered as handler-error');
      continue;
    }
    if (key.state !== 'done') {
      flag(id, `no stored answer (key ${key.state})`);
      continue;
    }
    const isError = key.response && key.response.error !== undefined;
    if (kind === 'refused' && !(isError && key.response.error.sqlstate === 'P0001'))
      flag(id, `refused message stored ${JSON.stringify(key.response)}, not the P0001 error`);
    if (kind !== 'refused' && isError)
      flag(id, `stored an error ${JSON.stringify(key.response)}`);
    if (kind === 'conflict') {
      const losing = payloads.find((payload) => payload.amount !== effect?.amounts[0]);
      if (!dead.some((letter) => letter.code === 'IK422' && isDeepStrictEqual(letter.payload, losing)))
        flag(id, 'the conflicting copy was not dead-lettered as IK422');
    } else if (dead.length !== 0) {
      flag(id, `dead-lettered though it applied: ${dead.map((letter) => letter.code).join(', ')}`);
    }
  }

  const replied = new Set();
  for (const reply of replies) {
    const key = stored.get(reply.id);
    replied.add(reply.id);
    // The same bytes as the stored answer (jsonb's text).
    if (!key || key.state !== 'done' || reply.text !== key.text)
      flag(reply.id, `reply ${reply.text} differs from the stored answer ${key?.text}`);
  }
  for (const [id, { kind }] of byId)
    if (kind !== 'poison' && !replied.has(id))
      flag(id, 'no reply');
  if (queueDepth !== 0)
    violations.push(`the queue still holds ${queueDepth} messages`);
  return violations;
}

module.exports = { check };
