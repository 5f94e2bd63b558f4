'use strict';
// idempotency-pg: retry-safe request handlers on PostgreSQL's idempotency
// extension, for node-postgres and Express.

const { idempotent, replay, DEFAULT_PROBLEM_BASE } = require('./express');
const { claim, complete, release, setWaitTimeout, setTtl, withIdempotency } = require('./pg');
const { keyRef } = require('./events');
const { fingerprint, requestFingerprint, canonicalJson, keepRawBody } = require('./fingerprint');
const { SHARED_KEYS, scopedKey } = require('./scope');
const { parseKey, readKey, MAX_KEY_BYTES } = require('./key');
const { isStored, NEVER_STORED, DEFAULT_VALIDATION_STATUSES } = require('./policy');
const { storedDocument, decodeBody } = require('./stored');
const errors = require('./errors');
const { consume, applyOnce, errorDocument } = require('./consumer');

module.exports = {
  idempotent,
  replay,
  DEFAULT_PROBLEM_BASE,
  keyRef,
  claim,
  complete,
  release,
  setWaitTimeout,
  setTtl,
  withIdempotency,
  fingerprint,
  requestFingerprint,
  canonicalJson,
  keepRawBody,
  SHARED_KEYS,
  scopedKey,
  parseKey,
  readKey,
  MAX_KEY_BYTES,
  isStored,
  NEVER_STORED,
  DEFAULT_VALIDATION_STATUSES,
  storedDocument,
  decodeBody,
  consume,
  applyOnce,
  errorDocument,
  IdempotencyError: errors.IdempotencyError,
  KeyInProgressError: errors.KeyInProgressError,
  KeyGoneError: errors.KeyGoneError,
  KeyReusedError: errors.KeyReusedError,
  InvalidKeyError: errors.InvalidKeyError,
  SealedError: errors.SealedError,
};
