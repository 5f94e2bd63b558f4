-- idempotency 0.1: the key table and the call.
\echo Use "CREATE EXTENSION idempotency" to load this file. \quit

-- Refuse a schema idempotency that someone else prepared: objects planted in
-- it, or a right to create them, would shadow or replace ours. CREATE
-- EXTENSION makes the schema itself when it does not exist.
DO $$
DECLARE
  target pg_catalog.oid := pg_catalog.to_regnamespace('idempotency');
BEGIN
  IF NOT (SELECT r.rolsuper
            FROM pg_catalog.pg_namespace AS n
            JOIN pg_catalog.pg_roles AS r ON r.oid OPERATOR(pg_catalog.=) n.nspowner
           WHERE n.oid OPERATOR(pg_catalog.=) target)
     OR EXISTS (SELECT 1 FROM pg_catalog.pg_depend AS d
                 WHERE d.refclassid OPERATOR(pg_catalog.=) 'pg_catalog.pg_namespace'::pg_catalog.regclass
                   AND d.refobjid OPERATOR(pg_catalog.=) target
                   AND d.classid OPERATOR(pg_catalog.<>) 'pg_catalog.pg_extension'::pg_catalog.regclass)
     OR EXISTS (SELECT 1 FROM pg_catalog.pg_namespace AS n, pg_catalog.aclexplode(n.nspacl) AS a
                 WHERE n.oid OPERATOR(pg_catalog.=) target
                   AND a.privilege_type OPERATOR(pg_catalog.=) 'CREATE'
                   AND a.grantee OPERATOR(pg_catalog.<>) n.nspowner)
  THEN
    RAISE EXCEPTION 'schema idempotency already exists and is not safe to install into'
      USING ERRCODE = '42P06',
            DETAIL = 'It must be owned by a superuser, hold no objects, and grant CREATE to no one else.',
            HINT = 'Drop or rename the existing schema idempotency, then run CREATE EXTENSION again.';
  END IF;
END
$$;

-- Every name below is schema-qualified and every operator is spelled
-- OPERATOR(pg_catalog.x), so objects planted in the caller's search_path
-- cannot take their place.

-- Every role may call the functions; the schema is usable by all.
GRANT USAGE ON SCHEMA idempotency TO PUBLIC;

-- One row per (scope, key). A row is written once, when the call that
-- claimed the key has run fn, in the caller's transaction; it becomes
-- visible to others when that transaction commits, so a committed row is
-- always 'done'. While the claiming transaction is open, other callers see
-- the key as in progress (IK409). idempotent_call is the only writer and
-- enforces the key's size (1 to 255 bytes) and the status itself: rows are
-- written straight to the heap and its indexes, without CHECK constraints
-- to evaluate on every call.
CREATE TABLE idempotency.keys (
    scope        pg_catalog.regrole     NOT NULL,
    key          pg_catalog.text COLLATE "C" NOT NULL,
    request_hash pg_catalog.text        NOT NULL,
    status       pg_catalog.text        NOT NULL DEFAULT 'done',
    response     pg_catalog.jsonb,
    created_at   pg_catalog.timestamptz NOT NULL,
    expires_at   pg_catalog.timestamptz NOT NULL,
    CONSTRAINT keys_pkey PRIMARY KEY (scope, key)
);

COMMENT ON TABLE idempotency.keys IS
    'processed idempotency keys with their stored responses; written only through idempotency.idempotent_call';

-- pg_dump keeps the keys.
SELECT pg_catalog.pg_extension_config_dump('idempotency.keys', '');

-- The calling role; a key's scope. Used by the row-level security policy.
CREATE FUNCTION idempotency.current_scope()
RETURNS pg_catalog.regrole
AS 'MODULE_PATHNAME', 'idempotency_current_scope'
LANGUAGE C STABLE STRICT PARALLEL SAFE;

-- Callers may read their own keys and nothing else; they write only through
-- idempotent_call, which stores rows with the table owner's rights.
REVOKE ALL ON TABLE idempotency.keys FROM PUBLIC;
GRANT SELECT ON TABLE idempotency.keys TO PUBLIC;
ALTER TABLE idempotency.keys ENABLE ROW LEVEL SECURITY;
CREATE POLICY keys_own_scope ON idempotency.keys FOR SELECT TO PUBLIC
    USING (scope OPERATOR(pg_catalog.=) idempotency.current_scope());

CREATE FUNCTION idempotency.idempotent_call(
    key pg_catalog.text, request_hash pg_catalog.text, fn pg_catalog.text)
RETURNS pg_catalog.jsonb
AS 'MODULE_PATHNAME', 'idempotency_idempotent_call'
LANGUAGE C VOLATILE CALLED ON NULL INPUT PARALLEL UNSAFE SECURITY INVOKER;

CREATE FUNCTION idempotency.idempotent_call(
    key pg_catalog.text, request_hash pg_catalog.text, fn pg_catalog.text,
    VARIADIC args "any")
RETURNS pg_catalog.jsonb
AS 'MODULE_PATHNAME', 'idempotency_idempotent_call'
LANGUAGE C VOLATILE CALLED ON NULL INPUT PARALLEL UNSAFE SECURITY INVOKER;

COMMENT ON FUNCTION idempotency.idempotent_call(pg_catalog.text, pg_catalog.text, pg_catalog.text) IS
    'run fn once per key: the first call runs it and stores its response with the key in the caller''s transaction; retries get the stored response';

-- Whether the last idempotent_call of this session answered with a stored
-- response (true), ran fn (false), or no call has completed yet (NULL).
CREATE FUNCTION idempotency.last_call_replayed()
RETURNS pg_catalog.bool
AS 'MODULE_PATHNAME', 'idempotency_last_call_replayed'
LANGUAGE C VOLATILE PARALLEL RESTRICTED;

-- Expiry
--
-- A key's TTL is fixed when it is claimed: expires_at = created_at + the
-- idempotency.ttl in force then, so expiry goes by expires_at. The index is
-- expiry's access path: each pass of a round goes on in it from where the
-- last one stopped, so a round reads only expired keys, whatever the
-- table's size (docs/expiry.md compares it with BRIN and partitions).
CREATE INDEX keys_expires_at_idx ON idempotency.keys (expires_at);

-- One expiry round in this database, now, in the caller's transaction;
-- returns how many keys it deleted. It deletes the keys of every role, so
-- only superusers may run it, and roles they grant EXECUTE to.
CREATE FUNCTION idempotency.expire()
RETURNS pg_catalog.int8
AS 'MODULE_PATHNAME', 'idempotency_expire'
LANGUAGE C VOLATILE PARALLEL UNSAFE;

COMMENT ON FUNCTION idempotency.expire() IS
    'deletes the keys of this database that are past their TTL, in the caller''s transaction; returns how many';

REVOKE ALL ON FUNCTION idempotency.expire() FROM PUBLIC;

-- What the expiry worker did, per database where the extension is
-- installed; kept in shared memory (needs the library preloaded) and empty
-- after a restart.
CREATE FUNCTION idempotency.expiry_status(
    OUT datid pg_catalog.oid,
    OUT running_since pg_catalog.timestamptz,
    OUT last_started pg_catalog.timestamptz,
    OUT last_finished pg_catalog.timestamptz,
    OUT last_deleted pg_catalog.int8,
    OUT last_error pg_catalog.text,
    OUT rounds pg_catalog.int8,
    OUT total_deleted pg_catalog.int8,
    OUT failed_rounds pg_catalog.int8)
RETURNS SETOF record
AS 'MODULE_PATHNAME', 'idempotency_expiry_status'
LANGUAGE C VOLATILE PARALLEL RESTRICTED;

CREATE VIEW idempotency.expiry_status AS
    SELECT s.datid, d.datname, s.running_since, s.last_started,
           s.last_finished,
           s.last_finished OPERATOR(pg_catalog.-) s.last_started AS last_duration,
           s.last_deleted, s.last_error, s.rounds, s.total_deleted,
           s.failed_rounds
      FROM idempotency.expiry_status() AS s
      LEFT JOIN pg_catalog.pg_database AS d
        ON d.oid OPERATOR(pg_catalog.=) s.datid;

COMMENT ON VIEW idempotency.expiry_status IS
    'the expiry worker''s last round in each database where the extension is installed: when, how long, keys deleted, error';

-- Monitoring roles may watch the worker.
REVOKE ALL ON FUNCTION idempotency.expiry_status() FROM PUBLIC;
REVOKE ALL ON idempotency.expiry_status FROM PUBLIC;
GRANT EXECUTE ON FUNCTION idempotency.expiry_status() TO pg_monitor;
GRANT SELECT ON idempotency.expiry_status TO pg_monitor;
