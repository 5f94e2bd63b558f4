#include "idempotency/protocol/outcome.hpp"

namespace idempotency::protocol {

namespace {
LastCall last{Outcome::none, false, 0, 0};
} // namespace

void clear_last_call() { last = LastCall{Outcome::none, false, 0, 0}; }

void record_last_call(Outcome outcome) {
  last = LastCall{outcome, false, 0, 0};
}

void record_last_call(Outcome outcome, TimestampTz created_at,
                      TimestampTz expires_at) {
  last = LastCall{outcome, true, created_at, expires_at};
}

const LastCall &last_call() { return last; }

const char *outcome_name(Outcome outcome) {
  switch (outcome) {
  case Outcome::none:
    break;
  case Outcome::ran:
    return "ran";
  case Outcome::replayed:
    return "replayed";
  case Outcome::stored_error:
    return "stored_error";
  case Outcome::replayed_error:
    return "replayed_error";
  }
  return nullptr;
}

} // namespace idempotency::protocol
