'use strict';
// The errors this package throws. Each carries a stable `code`; the ones
// that answer a request carry the HTTP `status` they map to.

class IdempotencyError extends Error {
  constructor(message, code, status) {
    super(message);
    this.name = new.target.name;
    this.code = code;
    if (status !== undefined)
      this.status = status;
  }
}

// The key is held by another open transaction (SQLSTATE IK409).
class KeyInProgressError extends IdempotencyError {
  constructor(message, cause) {
    super(message, 'IK409', 409);
    this.cause = cause;
  }
}

// The request already ran and its response is no longer kept (SQLSTATE
// IK410): it must not run again.
class KeyGoneError extends IdempotencyError {
  constructor(message, cause) {
    super(message, 'IK410', 410);
    this.cause = cause;
  }
}

// The key was used for another request (SQLSTATE IK422).
class KeyReusedError extends IdempotencyError {
  constructor(message, cause) {
    super(message, 'IK422', 422);
    this.cause = cause;
  }
}

// The key is empty, too long or has characters a key may not have.
class InvalidKeyError extends IdempotencyError {
  constructor(message, cause) {
    super(message, 'ERR_IDEMPOTENCY_INVALID_KEY', 400);
    this.cause = cause;
  }
}

// The request's transaction handle was used after the response was settled.
class SealedError extends IdempotencyError {
  constructor(message) {
    super(message, 'ERR_IDEMPOTENCY_SEALED');
  }
}

// SQLSTATEs of the claim that map to the errors above.
const CLAIM_ERRORS = {
  IK409: KeyInProgressError,
  IK410: KeyGoneError,
  IK422: KeyReusedError,
  22023: InvalidKeyError, // empty, or longer than 255 bytes
  22004: InvalidKeyError, // NULL
};

// The package's error for a database error raised by claim itself, or the
// error unchanged.
function fromClaimError(error) {
  const Type = error && CLAIM_ERRORS[error.code];
  return Type ? new Type(error.message, error) : error;
}

module.exports = {
  IdempotencyError, KeyInProgressError, KeyGoneError, KeyReusedError, InvalidKeyError, SealedError, fromClaimError,
};
