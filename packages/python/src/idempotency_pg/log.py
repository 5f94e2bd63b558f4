"""The adapters' record of each outcome, through the standard logging
module under the logger "idempotency_pg". A record names the request
(method and path), the event, and the key as key_ref: a digest of the key
the database holds, never the client's key or the request body, so a log
line cannot be replayed into an answer. Each record carries the fields as
attributes too (record.idempotency_event, .idempotency_key_ref,
.idempotency_status, .idempotency_reason) for structured handlers.

    event                level    when
    stored               DEBUG    a response was stored with its key
    replayed             INFO     a retry got the stored response
    conflict             INFO     409: the key is held by a request still running
    gone                 INFO     410: the request ran; its response expired
    mismatch             WARNING  422: the key came with another request
    not-stored           INFO     the response (or the endpoint's exception)
                                  rolled back; reason says why (WARNING when
                                  the response was too large to store)
    invalid-key          INFO     400: a malformed or missing key
    principal-required   INFO     401: the scope named no principal
"""
import hashlib
import logging

LOGGER_NAME = "idempotency_pg"
logger = logging.getLogger(LOGGER_NAME)


def key_ref(database_key):
    """16 hex digits of SHA-256 over the database key (the scoped key):
    enough to tell keys apart in a log; compute it from the key
    idempotency.lookup shows to find a key's lines."""
    if database_key is None:
        return None
    return hashlib.sha256(database_key.encode("utf-8")).hexdigest()[:16]


def log_event(level, event, method, path, database_key=None, status=None, reason=None):
    if not logger.isEnabledFor(level):
        return
    ref = key_ref(database_key)
    parts = [f"idempotency {event}: {method} {path}"]
    if ref is not None:
        parts.append(f"key_ref={ref}")
    if status is not None:
        parts.append(f"status={status}")
    if reason:
        parts.append(f"reason={reason}")
    logger.log(level, " ".join(parts), extra={
        "idempotency_event": event, "idempotency_key_ref": ref, "idempotency_status": status,
        "idempotency_reason": reason})


def not_stored_reason(status):
    """Why the policy did not store a response of this status."""
    if status >= 500:
        return f"status {status}: 5xx responses are never stored"
    if status in (408, 409, 425, 429):
        return f"status {status}: a 'not now' answer is never stored"
    return f"status {status}: validation failures are stored only with store_validation_errors"
