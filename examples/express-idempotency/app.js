'use strict';
// A checkout service: a page with a "Pay" button (public/) and
// POST /api/charges, made safe to retry by idempotency-pg's route wrapper
// (packages/node in the repository).
//
//   PGHOST=... PGDATABASE=... PGUSER=... PORT=8080 node app.js

const path = require('node:path');
const express = require('express');
const { Pool } = require('pg');
const { idempotent, SHARED_KEYS } = require('idempotency-pg');

// A test card number that the card network always declines.
const DECLINED_CARD = '4000000000000002';
// A test card number the network reports stolen only after the charge row
// is written: the route then throws an error with status 402, the way
// http-errors does, and nothing of the attempt may stay.
const STOLEN_CARD = '4000000000009979';

function problem(res, status, title, headers = {}) {
  res.status(status).set(headers).type('application/problem+json')
    .send(JSON.stringify({ title, status }));
}

// Charges an order's amount to a card, in the transaction the wrapper
// opened on req.db. A declined card is an answer too (402), kept with its
// charge row and replayed to retries; a card network outage is 503, rolled
// back and not kept, so a retry tries again.
async function charge(req, res) {
  const { order_id: orderId, card } = req.body ?? {};
  if (!Number.isSafeInteger(orderId) || typeof card !== 'string' || !/^\d{12,19}$/.test(card))
    return problem(res, 400, 'The body must be {"order_id": <integer>, "card": "<digits>"}');

  // Locks the order: charges of one order are made one at a time.
  const { rows: [order] } = await req.db.query(
    'SELECT id, amount_cents FROM orders WHERE id = $1 FOR UPDATE', [orderId]);
  if (order === undefined)
    return problem(res, 404, `No order ${orderId}`);

  const status = card === DECLINED_CARD ? 'declined' : 'succeeded';
  const { rows: [row] } = await req.db.query(
    `INSERT INTO charges (order_id, amount_cents, status) VALUES ($1, $2, $3)
     RETURNING id, created_at`, [order.id, order.amount_cents, status]);
  if (card === STOLEN_CARD) {
    const error = new Error('The card was reported stolen');
    error.status = 402;
    throw error;
  }
  if (status === 'succeeded') {
    const { rows: [network] } = await req.db.query('SELECT available FROM card_network');
    if (!network.available)
      return problem(res, 503, 'The card network is unavailable; retry later', { 'Retry-After': '1' });
  }

  res.status(status === 'succeeded' ? 201 : 402)
    .location(`/api/charges/${row.id}`)
    .json({
      charge_id: Number(row.id),
      order_id: Number(order.id),
      amount_cents: Number(order.amount_cents),
      last4: card.slice(-4),
      status,
      created_at: row.created_at,
    });
}

function createApp(pool) {
  const app = express();
  app.use(express.static(path.join(__dirname, 'public')));
  app.get('/api/orders/:id', async (req, res) => {
    if (!/^\d{1,18}$/.test(req.params.id))
      return problem(res, 404, 'No such order');
    const { rows: [order] } = await pool.query(
      'SELECT id, description, amount_cents FROM orders WHERE id = $1', [req.params.id]);
    if (order === undefined)
      return problem(res, 404, 'No such order');
    res.json({ id: Number(order.id), description: order.description, amount_cents: Number(order.amount_cents) });
  });
  // The demo has no accounts, so its keys are shared by every browser (the
  // keys are random UUIDs). An application with users scopes them, so that
  // one user's key never replays another's answer:
  //   idempotent({ pool, scope: (req) => req.user.id }, charge)
  app.post('/api/charges', express.json(), idempotent({ pool, scope: SHARED_KEYS }, charge));
  // Errors with a 4xx status (http-errors' convention) are answered with
  // their message; anything else is a 500. The idempotency wrapper has
  // rolled the request's transaction back before this runs.
  app.use((error, req, res, next) => {
    if (error.status >= 400 && error.status < 500)
      return problem(res, error.status, error.message);
    console.error('unexpected error:', error);
    problem(res, 500, 'Internal server error');
  });
  return app;
}

function main() {
  const pool = new Pool({ max: Number(process.env.POOL_SIZE ?? 10) });
  pool.on('error', (error) => console.error('idle database connection failed:', error.message));
  const server = createApp(pool).listen(Number(process.env.PORT ?? 8080), '127.0.0.1', () => {
    console.log(`listening on http://127.0.0.1:${server.address().port}`);
  });
  process.on('SIGTERM', () => server.close(() => pool.end()));
}

if (require.main === module)
  main();

module.exports = { createApp, DECLINED_CARD, STOLEN_CARD };
