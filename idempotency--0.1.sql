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
-- the key as in progress (IK409).
CREATE TABLE idempotency.keys (
    scope        pg_catalog.regrole     NOT NULL,
    key          pg_catalog.text COLLATE "C" NOT NULL,
    request_hash pg_catalog.text        NOT NULL,
    status       pg_catalog.text        NOT NULL DEFAULT 'done',
    response     pg_catalog.jsonb,
    created_at   pg_catalog.timestamptz NOT NULL,
    expires_at   pg_catalog.timestamptz NOT NULL,
    CONSTRAINT keys_pkey PRIMARY KEY (scope, key),
    CONSTRAINT keys_key_size CHECK
        (pg_catalog.octet_length(key) OPERATOR(pg_catalog.>=) 1
         AND pg_catalog.octet_length(key) OPERATOR(pg_catalog.<=) 255),
    CONSTRAINT keys_status CHECK
        (status OPERATOR(pg_catalog.=) ANY (ARRAY['in_progress', 'done']::pg_catalog.text[]))
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
