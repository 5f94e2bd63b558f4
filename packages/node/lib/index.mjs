// ESM entry point of idempotency-pg: the same objects as the CommonJS one.
import idempotencyPg from './index.js';

export const {
  idempotent, replay, DEFAULT_PROBLEM_BASE, keyRef, claim, complete, release, setWaitTimeout, setTtl,
  withIdempotency, fingerprint,
  requestFingerprint, canonicalJson, keepRawBody, SHARED_KEYS, scopedKey, parseKey, readKey, MAX_KEY_BYTES, isStored,
  NEVER_STORED, DEFAULT_VALIDATION_STATUSES, storedDocument, decodeBody, IdempotencyError,
  KeyInProgressError, KeyGoneError, KeyReusedError, InvalidKeyError, SealedError,
} = idempotencyPg;
export const { consume, applyOnce, errorDocument } = idempotencyPg;
export default idempotencyPg;
