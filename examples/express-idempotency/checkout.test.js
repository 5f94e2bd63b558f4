'use strict';
// The checkout page in a real browser: Debian's headless Chromium, driven by
// puppeteer-core, presses "Pay" the way people do (twice, again after a lost
// response, again while the first press is still in flight), and the test
// checks what the page shows and how many charges the database holds; and a
// card the route rejects by throwing after it wrote the charge row.
// Needs PGHOST/PGPORT/PGDATABASE/PGUSER like test.js; CHROMIUM (default
// /usr/bin/chromium) names the browser, RESULTS_DIR where the screenshot goes.

const { test, before, after } = require('node:test');
const assert = require('node:assert/strict');
const { once } = require('node:events');
const fs = require('node:fs');
const path = require('node:path');
const { Client, Pool } = require('pg');
const puppeteer = require('puppeteer-core');
const { createApp, STOLEN_CARD } = require('./app');

const resultsDir = process.env.RESULTS_DIR ?? path.join(__dirname, 'results');

let pool;
let server;
let baseUrl;
let db;
let browser;

async function createOrder(description, amountCents) {
  const { rows: [order] } = await db.query(
    `INSERT INTO orders (id, description, amount_cents)
     SELECT coalesce(max(id), 0) + 1, $1, $2 FROM orders RETURNING id`, [description, amountCents]);
  return Number(order.id);
}

async function chargesOf(orderId) {
  const { rows } = await db.query(
    "SELECT id FROM charges WHERE order_id = $1 AND status = 'succeeded' ORDER BY id", [orderId]);
  return rows.map((row) => Number(row.id));
}

async function waitFor(condition, what) {
  const deadline = Date.now() + 15000;
  while (!(await condition())) {
    if (Date.now() > deadline)
      throw new Error(`timed out waiting for ${what}`);
    await new Promise((resolve) => setTimeout(resolve, 20));
  }
}

async function openCheckout(orderId) {
  const page = await browser.newPage();
  await page.setViewport({ width: 640, height: 560 });
  const statuses = [];
  page.on('response', (response) => {
    if (response.url().endsWith('/api/charges'))
      statuses.push(response.status());
  });
  await page.goto(`${baseUrl}/checkout.html?order=${orderId}`);
  await page.waitForSelector('#pay:not([disabled])');
  return { page, statuses };
}

// The attempts the page lists, as { state, chargeId } in order.
function attemptsOn(page) {
  return page.$$eval('#attempts li', (items) =>
    items.map((item) => ({ state: item.dataset.state, chargeId: item.dataset.chargeId })));
}

async function waitForAttempts(page, expected, what) {
  await waitFor(async () => {
    const states = (await attemptsOn(page)).map((attempt) => attempt.state);
    return JSON.stringify(states) === JSON.stringify(expected);
  }, `${what}: attempts ${expected.join(', ')}`);
}

// Saves what the page shows, for people to look at.
async function screenshot(page, name) {
  fs.mkdirSync(resultsDir, { recursive: true });
  await page.screenshot({ path: path.join(resultsDir, name) });
}

before(async () => {
  db = new Client();
  await db.connect();
  pool = new Pool({ max: 5 });
  server = createApp(pool).listen(0, '127.0.0.1');
  await once(server, 'listening');
  baseUrl = `http://127.0.0.1:${server.address().port}`;
  browser = await puppeteer.launch({
    executablePath: process.env.CHROMIUM ?? '/usr/bin/chromium',
    headless: true,
    // The sandbox needs user namespaces, which containers and root lack.
    args: ['--no-sandbox', '--disable-gpu', '--disable-dev-shm-usage'],
  });
});

after(async () => {
  await browser?.close();
  server.close();
  await pool.end();
  await db.end();
});

test('a double click on Pay charges once and both clicks show the same receipt', async () => {
  const order = await createOrder('Double click', 1999);
  const { page } = await openCheckout(order);

  await page.click('#pay', { count: 2 });
  await waitForAttempts(page, ['paid', 'paid'], 'both clicks answered');

  const charges = await chargesOf(order);
  assert.equal(charges.length, 1);
  const attempts = await attemptsOn(page);
  assert.deepEqual(attempts.map((attempt) => Number(attempt.chargeId)), [charges[0], charges[0]]);
  assert.match(await page.$eval('#receipt', (receipt) => receipt.textContent),
    new RegExp(`Paid \\$19\\.99 with card ending 4242\\. Receipt #${charges[0]}$`));
  await page.close();
});

test('a lost response and a retry charge once, and the retry shows the receipt', async () => {
  const order = await createOrder('Lost response', 4500);
  const { page } = await openCheckout(order);
  // The first answer is dropped once the server has sent it (and so has
  // committed the charge), as when a connection breaks on the way back.
  const cdp = await page.createCDPSession();
  await cdp.send('Fetch.enable', {
    patterns: [{ urlPattern: '*/api/charges', requestStage: 'Response' }],
  });
  let dropped = 0;
  cdp.on('Fetch.requestPaused', ({ requestId }) => {
    const command = dropped++ === 0
      ? cdp.send('Fetch.failRequest', { requestId, errorReason: 'ConnectionReset' })
      : cdp.send('Fetch.continueRequest', { requestId });
    command.catch(() => {});
  });

  await page.click('#pay');
  await waitForAttempts(page, ['lost'], 'the first response to be lost');
  assert.equal((await chargesOf(order)).length, 1, 'the lost attempt did charge');
  assert.equal(await page.$eval('#receipt', (receipt) => receipt.hidden), true);

  await page.click('#pay');
  await waitForAttempts(page, ['lost', 'paid'], 'the retry to be answered');
  const charges = await chargesOf(order);
  assert.equal(charges.length, 1);
  assert.equal(Number((await attemptsOn(page))[1].chargeId), charges[0]);
  assert.equal(await page.$eval('#receipt', (receipt) => receipt.hidden), false);
  await page.close();
});

test('a click while the first is in flight is told "still processing" (409), then shows the receipt', async () => {
  const order = await createOrder('Concert tickets, 2 × $60', 12000);
  const { page, statuses } = await openCheckout(order);
  // Holding the order's row lock keeps the first charge in flight.
  const holder = new Client();
  await holder.connect();
  try {
    await holder.query('BEGIN');
    await holder.query('SELECT FROM orders WHERE id = $1 FOR UPDATE', [order]);
    await page.click('#pay');
    await waitFor(async () => {
      const { rows: [row] } = await db.query(
        `SELECT count(*) AS waiting FROM pg_stat_activity
          WHERE datname = current_database() AND wait_event_type = 'Lock'`);
      return Number(row.waiting) > 0;
    }, 'the first charge to wait for its order');

    await page.click('#pay');
    await waitForAttempts(page, ['sending', 'processing'], 'the second click to be told to wait');
    assert.ok(statuses.includes(409), `answers seen: ${statuses}`);
    assert.deepEqual(await chargesOf(order), []);
    await screenshot(page, 'checkout-processing.png');
  } finally {
    await holder.query('COMMIT');
    await holder.end();
  }

  await waitForAttempts(page, ['paid', 'paid'], 'both clicks answered');
  const charges = await chargesOf(order);
  assert.equal(charges.length, 1);
  assert.deepEqual((await attemptsOn(page)).map((attempt) => Number(attempt.chargeId)),
    [charges[0], charges[0]]);

  await screenshot(page, 'checkout.png');
  await page.close();
});

test('a route that throws after writing the charge leaves nothing; pressing Pay again is not a replay', async () => {
  const order = await createOrder('Stolen card', 2500);
  const { page, statuses } = await openCheckout(order);
  await page.click('#card', { count: 3 });
  await page.type('#card', STOLEN_CARD);
  const key = await page.$eval('#key', (element) => element.textContent);

  await page.click('#pay');
  await waitForAttempts(page, ['declined'], 'the stolen card to be declined');
  await page.click('#pay');
  await waitForAttempts(page, ['declined', 'declined'], 'the second press to be declined');
  assert.deepEqual(statuses, [402, 402]);
  // The thrown error's 402 is neither committed nor stored: no charge row of
  // any status, no key.
  const { rows: [row] } = await db.query('SELECT count(*)::int AS charges FROM charges WHERE order_id = $1', [order]);
  assert.equal(row.charges, 0);
  const { rows: [stored] } = await db.query('SELECT state FROM idempotency.lookup($1)', [key]);
  assert.equal(stored.state, 'absent');

  // Another card is a new intent: paid once.
  await page.click('#card', { count: 3 });
  await page.type('#card', '4242424242424242');
  await page.click('#pay');
  await waitForAttempts(page, ['declined', 'declined', 'paid'], 'the other card to pay');
  assert.equal((await chargesOf(order)).length, 1);
  await page.close();
});
