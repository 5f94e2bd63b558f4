'use strict';
// What the Express wrapper reports of each keyed request's outcome, to the
// route's onEvent hook: one plain object per outcome, never the body, the
// client's key or the principal, only keyRef (a hash of the database key).
//
//   { type: 'replayed', level: 'info', keyRef: '3f2a…', status: 201, method: 'POST', path: '/charges' }
//
// type is one of stored, replayed, conflict, mismatch, gone, not-stored
// (with reason), invalid-key (400: a malformed or missing key, with reason)
// and principal-required (with error when scope threw), as consume()'s
// events have a type.

const { createHash } = require('node:crypto');
const { debuglog } = require('node:util');

// The first 16 hex digits of SHA-256 over the database key: lines of one
// key (and principal) match, and the key itself stays out of the logs.
function keyRef(databaseKey) {
  return createHash('sha256').update(databaseKey, 'utf8').digest('hex').slice(0, 16);
}

// A mismatch (422) is a client's mistake worth seeing; the others are a
// day's work.
const WARNINGS = new Set(['mismatch']);

// The request's path without its query string (which may carry secrets).
function pathOf(req) {
  const url = req.originalUrl ?? req.url ?? '';
  const query = url.indexOf('?');
  return query === -1 ? url : url.slice(0, query);
}

function outcomeEvent(req, type, { databaseKey, status, reason, error } = {}) {
  const level = WARNINGS.has(type) ? 'warn' : 'info';
  const record = { type, level, method: req.method, path: pathOf(req) };
  if (databaseKey !== undefined)
    record.keyRef = keyRef(databaseKey);
  if (status !== undefined)
    record.status = status;
  if (reason !== undefined)
    record.reason = reason;
  if (error !== undefined)
    record.error = error;
  // What the application should look at: a scope that threw, a response
  // the route cannot store.
  if (error !== undefined || reason === 'response-too-large' || reason === 'storing-failed')
    record.level = 'warn';
  return record;
}

// The default hook: silent unless NODE_DEBUG=idempotency-pg, Node's own
// switch for a library's debug output (to stderr).
const debug = debuglog('idempotency-pg');
function debugEvent(event) {
  const fields = [`key=${event.keyRef ?? '-'}`, `status=${event.status ?? '-'}`];
  if (event.reason !== undefined)
    fields.push(`reason=${event.reason}`);
  if (event.error !== undefined)
    fields.push(`error=${JSON.stringify(String(event.error))}`);
  debug('%s %s %s %s', event.type, event.method, event.path, fields.join(' '));
}

module.exports = { keyRef, outcomeEvent, debugEvent };
