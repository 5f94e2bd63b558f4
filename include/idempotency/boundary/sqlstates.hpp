// The extension's own SQLSTATEs (class IK), defined once: clients read them
// to retry, replay or fix a request (docs/ list them with their meaning).
#pragma once

#include "idempotency/pg.hpp"

namespace idempotency {

// IK409: another transaction holds the key; retry the request later.
constexpr int errcode_key_in_progress = MAKE_SQLSTATE('I', 'K', '4', '0', '9');
// IK422: the key was already used with a request of another fingerprint.
constexpr int errcode_key_reused = MAKE_SQLSTATE('I', 'K', '4', '2', '2');
// IK508: this transaction holds the key already, not yet completed.
constexpr int errcode_key_recursion = MAKE_SQLSTATE('I', 'K', '5', '0', '8');

} // namespace idempotency
