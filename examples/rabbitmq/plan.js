'use strict';
// The messages of a run, the same every time for a given count: transfers
// t-0 ... t-(n-1) on 50 accounts (round robin; the benchmark may ask for
// more), of which some are
//   refused   (every 97th)  a withdrawal the balance cannot cover: the stored answer is an error
//   poison    (every 499th) the handler always fails: dead-lettered after its attempts
//   duplicate (every 53rd)  published twice, identical: the broker "honestly delivers again";
//                           the copy follows at once, so competing consumers often hold both
//                           at the same time (IK409) -- or 300 messages later (every other one)
//   conflict  (every 211th) published twice with different amounts: one applies, the other is IK422
// Every message asks for a reply (reply_to transfers.replies, correlation_id = its id).

function kindOf(i) {
  if (i % 499 === 498) return 'poison';
  if (i % 211 === 210) return 'conflict';
  if (i % 97 === 96) return 'refused';
  if (i % 53 === 52) return 'duplicate';
  return 'plain';
}

function payloadOf(i, kind, accounts) {
  const account = 1 + (i % accounts);
  if (kind === 'poison') return { account, amount: 1, poison: 'the handler refuses this message' };
  if (kind === 'refused') return { account, amount: -1000000000 };
  return { account, amount: 1 + (i % 7) };
}

// [{ id, kind, payload }] in publishing order.
// With { plainOnly: true }: count plain transfers, nothing else (the benchmark).
function plan(count, { plainOnly = false, accounts = 50 } = {}) {
  const messages = [];
  const later = [];
  for (let i = 0; i < count; i++) {
    const kind = plainOnly ? 'plain' : kindOf(i);
    const id = `t-${i}`;
    const payload = payloadOf(i, kind, accounts);
    messages.push({ id, kind, payload });
    if (kind === 'duplicate')
      later.push({ at: i % 2 === 0 ? i : i + 300, message: { id, kind, payload } });
    if (kind === 'conflict')
      later.push({ at: i + 300, message: { id, kind, payload: { ...payload, amount: payload.amount + 100 } } });
  }
  const ordered = [];
  for (let i = 0; i < messages.length; i++) {
    ordered.push(messages[i]);
    for (const copy of later.filter((entry) => entry.at === i))
      ordered.push(copy.message);
  }
  for (const copy of later.filter((entry) => entry.at >= messages.length))
    ordered.push(copy.message);
  return ordered;
}

module.exports = { plan };
