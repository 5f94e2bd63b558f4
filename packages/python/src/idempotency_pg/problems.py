"""The problem documents (RFC 9457) the adapters answer with. Their type is
problem_base + a name; the default base is a URN, stable across versions
and hosts, so a client can match on it:

    urn:idempotency:problem:request-in-progress       409
    urn:idempotency:problem:request-already-ran       410
    urn:idempotency:problem:idempotency-key-reused    422
    urn:idempotency:problem:invalid-idempotency-key   400
    urn:idempotency:problem:missing-idempotency-key   400
    urn:idempotency:problem:principal-required        401
    urn:idempotency:problem:response-too-large        500

An application that documents its problems under its own URL passes
problem_base (Django: the IDEMPOTENCY_PROBLEM_BASE setting for every
view)."""

DEFAULT_PROBLEM_BASE = "urn:idempotency:problem:"
