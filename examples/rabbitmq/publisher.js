'use strict';
// Publishes the messages of plan.js to the `transfers` queue on a confirm
// channel: persistent messages, each with its message id, reply_to and
// correlation_id; returns once the broker has confirmed every one.
//
//   AMQP_URL=amqp://... node publisher.js COUNT

const amqp = require('amqplib');
const { plan } = require('./plan');
const { QUEUE, REPLIES, declareTopology } = require('./topology');

async function publish(url, count, planOptions = {}) {
  const connection = await amqp.connect(url);
  try {
    const channel = await connection.createConfirmChannel();
    await declareTopology(channel);
    const messages = plan(count, planOptions);
    let sent = 0;
    for (const { id, payload } of messages) {
      const room = channel.sendToQueue(QUEUE, Buffer.from(JSON.stringify(payload)), {
        messageId: id, correlationId: id, replyTo: REPLIES, persistent: true, contentType: 'application/json',
      });
      if (++sent % 500 === 0 || !room)
        await channel.waitForConfirms(); // a nack rejects here, and the run stops
    }
    await channel.waitForConfirms();
    return messages;
  } finally {
    await connection.close();
  }
}

module.exports = { publish };

if (require.main === module) {
  publish(process.env.AMQP_URL, Number(process.argv[2] || 1000)).then((messages) => {
    console.log(`published and confirmed: ${messages.length} messages`);
  }).catch((error) => {
    console.error(error);
    process.exit(1);
  });
}
