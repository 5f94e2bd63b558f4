'use strict';
// The queues of the example: `transfers` (durable, messages persistent) and
// `transfers.dead` for the messages the consumers dead-letter with a reason
// in their headers, and `transfers.replies` where the answers go.

const QUEUE = 'transfers';
const DEAD_LETTERS = 'transfers.dead';
const REPLIES = 'transfers.replies';

async function declareTopology(channel) {
  await channel.assertQueue(QUEUE, { durable: true });
  await channel.assertQueue(DEAD_LETTERS, { durable: true });
  await channel.assertQueue(REPLIES, { durable: true });
}

module.exports = { QUEUE, DEAD_LETTERS, REPLIES, declareTopology };
