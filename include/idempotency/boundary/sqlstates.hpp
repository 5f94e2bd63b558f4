// The extension's own SQLSTATEs (class IK; docs/errors.md).
#pragma once

#include "idempotency/pg.hpp"

namespace idempotency {

// IK409: another transaction holds the key; retry the request later.
constexpr int errcode_key_in_progress = MAKE_SQLSTATE('I', 'K', '4', '0', '9');
// IK410: the key ran and only its tombstone is left (idempotency.remember).
constexpr int errcode_key_gone = MAKE_SQLSTATE('I', 'K', '4', '1', '0');
// IK422: the key was already used with a request of another fingerprint.
constexpr int errcode_key_reused = MAKE_SQLSTATE('I', 'K', '4', '2', '2');
// IK508: this transaction holds the key already, not yet completed.
constexpr int errcode_key_recursion = MAKE_SQLSTATE('I', 'K', '5', '0', '8');

// An answer about one key: idempotency.claim_batch reports it as its row.
constexpr bool is_key_answer(int sqlerrcode) {
  return ERRCODE_TO_CATEGORY(sqlerrcode) ==
         MAKE_SQLSTATE('I', 'K', '0', '0', '0');
}

} // namespace idempotency
