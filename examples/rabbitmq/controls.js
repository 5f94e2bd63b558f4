'use strict';
// The negative controls of the checker (check.js): for every kind of
// violation it reports, one planted fault on the settled run, which the
// checker must flag as that violation of that message id. Faults in the
// database (a ledger row, a stored answer) are planted inside a transaction
// that is rolled back; the others on copies of the replies, the dead letters
// and the queue depth. Returns [{ name, flagged }], one per control.

const { check } = require('./check');

async function controls(db, messages, replies, deadLetters) {
  const first = (kind) => {
    const message = messages.find((m) => m.kind === kind);
    if (!message) throw new Error(`the run has no ${kind} message to plant a fault on`);
    return message;
  };
  const plain = first('plain');
  const other = messages.find((m) => m.kind === 'plain' && m.id !== plain.id);
  const refused = first('refused');
  const poison = first('poison');
  const conflict = first('conflict');
  const replyOf = (id) => {
    const reply = replies.find((r) => r.id === id);
    if (!reply) throw new Error(`the run has no reply to ${id} to plant a fault on`);
    return reply;
  };
  const wrongAnswer = { ...replyOf(plain.id).answer, planted: true };
  // Stores `response` as the answer of `id`, replacing whatever it had.
  const store = async (id, response) => {
    await db.query('SELECT idempotency.forget($1)', [id]);
    await db.query("SELECT FROM idempotency.claim($1, 'planted')", [id]);
    await db.query('SELECT idempotency.complete($1, $2)', [id, JSON.stringify(response)]);
  };
  const addLedgerRow = (message, amount) => db.query(
    'INSERT INTO public.ledger (message_id, account, amount) VALUES ($1, $2, $3)',
    [message.id, message.payload.account, amount]);

  const planted = [
    { name: 'a dead letter without a code and reason', id: poison.id, flags: 'dead-lettered without a code',
      deadLetters: () => [...deadLetters, { id: poison.id, code: undefined, reason: undefined, payload: poison.payload }] },
    { name: 'a refused message applied', id: refused.id, flags: 'refused message applied 1 times',
      database: () => addLedgerRow(refused, refused.payload.amount) },
    { name: 'a poison message applied', id: poison.id, flags: 'poison message applied 1 times',
      database: () => addLedgerRow(poison, poison.payload.amount) },
    { name: 'a duplicate effect', id: plain.id, flags: 'applied 2 times, not once',
      database: () => addLedgerRow(plain, plain.payload.amount) },
    { name: 'an effect no copy carried', id: plain.id, flags: 'applied with amount',
      database: () => db.query('UPDATE public.ledger SET amount = amount + 1000 WHERE message_id = $1', [plain.id]) },
    { name: 'a poison message with a stored answer', id: poison.id, flags: 'poison message has a stored answer',
      database: () => store(poison.id, { planted: true }) },
    { name: 'a poison message not dead-lettered', id: poison.id, flags: 'poison message not dead-lettered',
      deadLetters: () => deadLetters.filter((letter) => letter.id !== poison.id) },
    { name: 'a message without a stored answer', id: plain.id, flags: 'no stored answer',
      database: () => db.query('SELECT idempotency.forget($1)', [plain.id]) },
    { name: 'a refused message storing no error', id: refused.id, flags: 'refused message stored',
      database: () => store(refused.id, { planted: true }) },
    { name: 'a message storing an error', id: plain.id, flags: 'stored an error',
      database: () => store(plain.id, { error: { sqlstate: 'P0001', message: 'planted' } }) },
    { name: 'a conflicting copy not dead-lettered', id: conflict.id, flags: 'the conflicting copy was not dead-lettered',
      deadLetters: () => deadLetters.filter((letter) => !(letter.id === conflict.id && letter.code === 'IK422')) },
    { name: 'a dead letter of an applied message', id: other.id, flags: 'dead-lettered though it applied',
      deadLetters: () => [...deadLetters, { id: other.id, code: 'handler-error', reason: 'planted', payload: other.payload }] },
    { name: 'a wrong reply', id: plain.id, flags: 'reply {',
      replies: () => [...replies, { id: plain.id, answer: wrongAnswer, text: JSON.stringify(wrongAnswer) }] },
    { name: 'a message without a reply', id: plain.id, flags: 'no reply',
      replies: () => replies.filter((reply) => reply.id !== plain.id) },
    { name: 'a message left in the queue', id: null, flags: 'the queue still holds 1 messages', queueDepth: 1 },
  ];

  const results = [];
  for (const fault of planted) {
    await db.query('BEGIN');
    let violations;
    try {
      if (fault.database) await fault.database();
      violations = await check(db, messages, fault.replies ? fault.replies() : replies,
        fault.deadLetters ? fault.deadLetters() : deadLetters, { queueDepth: fault.queueDepth ?? 0 });
    } finally {
      await db.query('ROLLBACK');
    }
    const prefix = fault.id === null ? fault.flags : `${fault.id}: ${fault.flags}`;
    results.push({ name: fault.name, flagged: violations.some((violation) => violation.startsWith(prefix)) });
  }
  return results;
}

module.exports = { controls };
