-- idempotency 0.2 -> 0.3: every change to the key row and the objects around
-- it that this version makes. A fresh install runs 0.1, 0.1--0.2 and this
-- script in order.
\echo Use "ALTER EXTENSION idempotency UPDATE TO '0.3'" to load this file. \quit


-- Application API: claim a key in the handler's own transaction, do the work
-- in application code, complete it with the response. Same key table, same
-- claim mechanism and same rules (IK409, IK422, wait_timeout, TTL, per-role
-- scope) as idempotent_call. Also: idempotent_call's outcome with times,
-- and lookup/forget of the caller's own keys for support tooling.

-- proceed (replayed = false: this transaction now holds the key; response
-- and times are NULL) or replay (replayed = true: the stored response, which
-- may be NULL, with its times). Always one row.
CREATE FUNCTION idempotency.claim(key pg_catalog.text, request_hash pg_catalog.text)
RETURNS TABLE (replayed pg_catalog.bool, response pg_catalog.jsonb,
               created_at pg_catalog.timestamptz, expires_at pg_catalog.timestamptz)
AS 'MODULE_PATHNAME', 'idempotency_claim'
LANGUAGE C VOLATILE CALLED ON NULL INPUT PARALLEL UNSAFE SECURITY INVOKER ROWS 1;

COMMENT ON FUNCTION idempotency.claim(pg_catalog.text, pg_catalog.text) IS
    'take an idempotency key in this transaction (replayed = false) or get its stored response (replayed = true); complete or release it before COMMIT';

-- Stores the response of a key this transaction claimed; it commits or rolls
-- back with the transaction. 55000 when this transaction holds no claim on
-- the key.
CREATE FUNCTION idempotency.complete(key pg_catalog.text, response pg_catalog.jsonb)
RETURNS pg_catalog.void
AS 'MODULE_PATHNAME', 'idempotency_complete'
LANGUAGE C VOLATILE CALLED ON NULL INPUT PARALLEL UNSAFE SECURITY INVOKER;

-- Lets go of a claim of this transaction without storing anything.
CREATE FUNCTION idempotency.release(key pg_catalog.text)
RETURNS pg_catalog.void
AS 'MODULE_PATHNAME', 'idempotency_release'
LANGUAGE C VOLATILE CALLED ON NULL INPUT PARALLEL UNSAFE SECURITY INVOKER;

-- The last idempotent_call or claim of this session: ran, replayed,
-- stored_error or replayed_error, with the stored row's times. No row before
-- the first call, or after a call that failed.
CREATE FUNCTION idempotency.last_call()
RETURNS TABLE (outcome pg_catalog.text, created_at pg_catalog.timestamptz,
               expires_at pg_catalog.timestamptz)
AS 'MODULE_PATHNAME', 'idempotency_last_call'
LANGUAGE C VOLATILE PARALLEL RESTRICTED ROWS 1;

-- The state of one of the caller's own keys: absent, in_progress, done or
-- expired, with its times and (done) its response.
CREATE FUNCTION idempotency.lookup(key pg_catalog.text)
RETURNS TABLE (state pg_catalog.text, created_at pg_catalog.timestamptz,
               expires_at pg_catalog.timestamptz, response pg_catalog.jsonb)
AS 'MODULE_PATHNAME', 'idempotency_lookup'
LANGUAGE C VOLATILE CALLED ON NULL INPUT PARALLEL UNSAFE SECURITY INVOKER ROWS 1;

-- Deletes one of the caller's own done keys (true); false when there is
-- none; IK409 while the key is in progress.
CREATE FUNCTION idempotency.forget(key pg_catalog.text)
RETURNS pg_catalog.bool
AS 'MODULE_PATHNAME', 'idempotency_forget'
LANGUAGE C VOLATILE CALLED ON NULL INPUT PARALLEL UNSAFE SECURITY INVOKER;

COMMENT ON TABLE idempotency.keys IS
    'processed idempotency keys with their stored responses; written only through idempotency.idempotent_call and idempotency.complete';
