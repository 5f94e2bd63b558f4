'use strict';
// Keeps each API client's keys apart. The database scopes keys by role, and
// an application calls it as one pool role for every client; so the key the
// wrappers send to the database is derived from the request's scope (its
// principal: the user, API client or tenant it comes from) and the client's
// Idempotency-Key, by one rule shared with the Python package
// (packages/shared/scope-vectors.json holds its vectors):
//
//   "§" S ":" key       when that is at most 255 bytes of UTF-8
//   "§" S "#" H         otherwise
//
// - S: the first 32 hex digits (lower case) of SHA-256 over the scope's
//   UTF-8 text; a scope is a non-empty string, or an integer written in
//   decimal;
// - H: the 64 hex digits of SHA-256 over the key's UTF-8 text.
//
// "§" (U+00A7, two bytes in UTF-8) is not printable ASCII, so no
// Idempotency-Key header holds it: a client's key can never be another
// client's derived key, even on a route whose keys are shared. The derived
// key is what idempotency.lookup() and the stored rows show.

const { createHash } = require('node:crypto');
const { MAX_KEY_BYTES } = require('./key');

// The opt-out: a route whose keys are shared by every client that calls it
// (one trusted caller, say). Write it so that it reads as what it does:
//   idempotent({ pool, scope: SHARED_KEYS }, handler)
const SHARED_KEYS = Object.freeze({ toString: () => 'SHARED_KEYS' });

const sha256hex = (text) => createHash('sha256').update(text, 'utf8').digest('hex');

// The scope's text: a non-empty string, or an integer in decimal. null,
// undefined and '' mean "no principal" and give null.
function scopeText(scope) {
  if (scope === null || scope === undefined || scope === '')
    return null;
  if (typeof scope === 'string')
    return scope;
  if ((typeof scope === 'number' && Number.isSafeInteger(scope)) || typeof scope === 'bigint')
    return String(scope);
  throw new TypeError(`an idempotency scope must be a string or an integer, not ${typeof scope}`);
}

// The database key of a client's key within a scope (SHARED_KEYS: the key
// itself).
function scopedKey(scope, key) {
  if (scope === SHARED_KEYS)
    return key;
  const text = scopeText(scope);
  if (text === null)
    throw new TypeError('scopedKey(scope, key): the scope is empty');
  const prefix = `§${sha256hex(text).slice(0, 32)}`;
  const plain = `${prefix}:${key}`;
  return Buffer.byteLength(plain, 'utf8') <= MAX_KEY_BYTES ? plain : `${prefix}#${sha256hex(key)}`;
}

module.exports = { SHARED_KEYS, scopedKey, scopeText };
