// What the last idempotent_call or claim of this session did, for
// idempotency.last_call() and last_call_replayed(): per session, replaced by
// each call, cleared when a call starts (so a call that fails leaves none).
#pragma once

#include "idempotency/pg.hpp"

extern "C" {
#include "datatype/timestamp.h"
}

namespace idempotency::protocol {

enum class Outcome {
  none,          // no call yet, or the last one failed
  ran,           // fn ran (idempotent_call) or the key was claimed (claim)
  replayed,      // the stored response was returned
  stored_error,  // fn raised an error listed in store_errors; it was stored
  replayed_error // the stored response is a stored error
};

struct LastCall {
  Outcome outcome;
  bool has_times; // false for a claim that proceeded: nothing stored yet
  TimestampTz created_at;
  TimestampTz expires_at;
};

void clear_last_call();
void record_last_call(Outcome outcome);
void record_last_call(Outcome outcome, TimestampTz created_at,
                      TimestampTz expires_at);
const LastCall &last_call();

const char *outcome_name(Outcome outcome);

} // namespace idempotency::protocol
