'use strict';
// The checkout page's script. Every press of "Pay" sends POST /api/charges
// with the Idempotency-Key of the current payment intent (this order, this
// card): a double click, a retry after a lost response and a retry after
// "still processing" all repeat the key, so the order is charged once and
// each attempt shows the same receipt. The button stays enabled on purpose:
// the key, not the button, makes a second press harmless.

const orderId = Number(new URLSearchParams(location.search).get('order') ?? '1');
const MAX_BUSY_RETRIES = 30;

const element = (id) => document.getElementById(id);
const money = (cents) => `$${(cents / 100).toFixed(2)}`;
const sleep = (ms) => new Promise((resolve) => setTimeout(resolve, ms));

// A new intent, with a new key, whenever the card changes: paying with
// another card after a decline is a new request, not a retry.
let intentKey;
function newIntent() {
  intentKey = crypto.randomUUID();
  element('key').textContent = intentKey;
}

let attempts = 0;
function addAttempt() {
  const item = document.createElement('li');
  item.id = `attempt-${++attempts}`;
  element('attempts').append(item);
  const number = attempts;
  return (state, text, chargeId) => {
    item.dataset.state = state;
    if (chargeId !== undefined)
      item.dataset.chargeId = chargeId;
    item.textContent = `Attempt ${number}: ${text}`;
  };
}

function showReceipt(charge) {
  const receipt = element('receipt');
  receipt.hidden = false;
  receipt.dataset.chargeId = charge.charge_id;
  receipt.textContent =
    `Paid ${money(charge.amount_cents)} with card ending ${charge.last4}. Receipt #${charge.charge_id}`;
}

async function sendCharge(card) {
  return fetch('/api/charges', {
    method: 'POST',
    headers: { 'Content-Type': 'application/json', 'Idempotency-Key': intentKey },
    body: JSON.stringify({ order_id: orderId, card }),
  });
}

async function pay() {
  const show = addAttempt();
  const card = element('card').value.replace(/\s+/g, '');
  show('sending', 'sending…');
  for (let busy = 0; ; busy++) {
    let response;
    try {
      response = await sendCharge(card);
    } catch {
      show('lost', 'connection lost; the payment may have gone through. Press Pay again: you will not be charged twice.');
      return;
    }
    if (response.status === 409 && busy < MAX_BUSY_RETRIES) {
      show('processing', 'still processing the payment…');
      await sleep(Number(response.headers.get('Retry-After') ?? '1') * 1000);
      continue;
    }
    const body = await response.json();
    const replayed = response.headers.get('Idempotent-Replayed') === 'true';
    if (response.status === 201) {
      showReceipt(body);
      show('paid', `paid, receipt #${body.charge_id}${replayed ? ' (already paid: same receipt)' : ''}`,
        body.charge_id);
    } else if (response.status === 402) {
      show('declined', 'card declined; try another card.');
    } else {
      show('failed', `${body.title ?? response.statusText}`);
    }
    return;
  }
}

async function loadOrder() {
  const response = await fetch(`/api/orders/${orderId}`);
  const order = await response.json();
  if (!response.ok) {
    element('description').textContent = order.title;
    return;
  }
  element('description').textContent = order.description;
  element('total').textContent = money(order.amount_cents);
  element('pay').textContent = `Pay ${money(order.amount_cents)}`;
  element('pay').disabled = false;
}

newIntent();
element('card').addEventListener('input', newIntent);
element('pay').addEventListener('click', pay);
loadOrder();
