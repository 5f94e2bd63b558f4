'use strict';
// Which responses are stored for their key (and commit the handler's work):
//
// - 5xx: never: the server failed, a retry must run the handler again;
// - 408, 409, 425, 429: never: they say "not now", not "this is the answer";
// - the validation statuses (400 and 422 by default): only when the route
//   sets storeValidationErrors, so a client that fixes a typo can retry with
//   the same key;
// - everything else (2xx, 3xx, other 4xx such as 402 or 404): stored.
//
// A response that is not stored rolls its transaction back.

const NEVER_STORED = Object.freeze([408, 409, 425, 429]);
const DEFAULT_VALIDATION_STATUSES = Object.freeze([400, 422]);

function isStored(status, { storeValidationErrors = false, validationStatuses = DEFAULT_VALIDATION_STATUSES } = {}) {
  if (status >= 500 || NEVER_STORED.includes(status))
    return false;
  if (validationStatuses.includes(status))
    return storeValidationErrors;
  return true;
}

// Why a response of this status is not stored ('server-error', 'not-now',
// 'validation'), or null when it is.
function notStoredReason(status, settings) {
  if (isStored(status, settings))
    return null;
  if (status >= 500)
    return 'server-error';
  return NEVER_STORED.includes(status) ? 'not-now' : 'validation';
}

module.exports = { isStored, notStoredReason, NEVER_STORED, DEFAULT_VALIDATION_STATUSES };
