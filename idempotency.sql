-- idempotency: the whole current schema, in one readable script.
--
-- `make` copies this file to idempotency--<default_version>.sql (the
-- control file's default_version), which CREATE EXTENSION runs for a fresh
-- install. A database at the previous version (1.0) reaches the same schema
-- through the update script idempotency--1.0--1.1.sql; the library serves
-- its own version's schema and the one before it
-- (docs/operations.md#upgrading).
--
-- Adding or changing an object therefore means editing two files: this one
-- (the object as it is now, in its section below) and the newest update
-- script (how an existing database gets there).
-- test/tap/308_install_matches_upgrades.pl creates the extension fresh and
-- updates it from the previous version, and fails when the catalogs
-- differ (an object, a column, a comment or a grant that one path makes and
-- the other does not).
--
-- The one intended difference: tables made by updates keep the columns
-- earlier versions dropped (attisdropped), a fresh table has none. The
-- library finds every column by name.
\echo Use "CREATE EXTENSION idempotency" to load this file. \quit

-- Every name below is schema-qualified and every operator is spelled
-- OPERATOR(pg_catalog.x), so objects planted in the caller's search_path
-- cannot take their place.

-- The database encoding -------------------------------------------------------
--
-- Keys, request fingerprints and derived keys are taken over text's UTF-8
-- form, with the server's default conversion from pg_catalog. In a database
-- whose encoding has none (MULE_INTERNAL) every call would fail: refuse to
-- install there instead (docs/operations.md).
DO $$
DECLARE
  encoding pg_catalog.name := pg_catalog.getdatabaseencoding();
BEGIN
  IF encoding OPERATOR(pg_catalog.<>) ALL (ARRAY['UTF8', 'SQL_ASCII']::pg_catalog.name[])
     AND NOT EXISTS (SELECT 1 FROM pg_catalog.pg_conversion AS c
                      WHERE c.connamespace OPERATOR(pg_catalog.=) 'pg_catalog'::pg_catalog.regnamespace
                        AND c.condefault
                        AND c.conforencoding OPERATOR(pg_catalog.=) pg_catalog.pg_char_to_encoding(encoding)
                        AND c.contoencoding OPERATOR(pg_catalog.=) pg_catalog.pg_char_to_encoding('UTF8'))
  THEN
    RAISE EXCEPTION 'idempotency cannot be installed in a database encoded in %', encoding
      USING ERRCODE = '0A000',
            DETAIL = pg_catalog.format('Keys and request fingerprints are taken over text''s UTF-8 form, and PostgreSQL has no conversion from %s to UTF8.', encoding),
            HINT = 'Use a database of another encoding, such as UTF8.';
  END IF;
END
$$;

-- The schema ----------------------------------------------------------------
--
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

-- Every role may call the functions; the schema is usable by all.
GRANT USAGE ON SCHEMA idempotency TO PUBLIC;

-- Role scope: the role a key belongs to ---------------------------------------
--
-- idempotency.role_scope keeps the role's OID inside the cluster (a rename
-- keeps the role's keys; lookups compare 4-byte values) and reads and writes
-- the role's name everywhere else - text and binary I/O, so COPY, pg_dump
-- and logical replication in both modes - which each node maps to its own
-- role of that name. A role that no longer exists is written "-" and read
-- back as no role (OID 0), which is never a caller's scope.

CREATE TYPE idempotency.role_scope;

CREATE FUNCTION idempotency.role_scope_in(pg_catalog.cstring)
RETURNS idempotency.role_scope
AS 'MODULE_PATHNAME', 'idempotency_role_scope_in'
LANGUAGE C STABLE STRICT PARALLEL SAFE;

CREATE FUNCTION idempotency.role_scope_out(idempotency.role_scope)
RETURNS pg_catalog.cstring
AS 'MODULE_PATHNAME', 'idempotency_role_scope_out'
LANGUAGE C STABLE STRICT PARALLEL SAFE;

CREATE FUNCTION idempotency.role_scope_recv(pg_catalog.internal)
RETURNS idempotency.role_scope
AS 'MODULE_PATHNAME', 'idempotency_role_scope_recv'
LANGUAGE C STABLE STRICT PARALLEL SAFE;

CREATE FUNCTION idempotency.role_scope_send(idempotency.role_scope)
RETURNS pg_catalog.bytea
AS 'MODULE_PATHNAME', 'idempotency_role_scope_send'
LANGUAGE C STABLE STRICT PARALLEL SAFE;

CREATE TYPE idempotency.role_scope (
    INPUT = idempotency.role_scope_in,
    OUTPUT = idempotency.role_scope_out,
    RECEIVE = idempotency.role_scope_recv,
    SEND = idempotency.role_scope_send,
    INTERNALLENGTH = 4,
    PASSEDBYVALUE,
    ALIGNMENT = int4,
    STORAGE = plain
);

COMMENT ON TYPE idempotency.role_scope IS
    'the role an idempotency key belongs to: its OID in this cluster, its name in text and binary I/O';

-- Comparison is the oid type's: the same 4 bytes, the same order, the same
-- (leakproof where oid's are) built-in functions.
CREATE FUNCTION idempotency.role_scope_eq(idempotency.role_scope, idempotency.role_scope)
RETURNS pg_catalog.bool AS 'oideq'
LANGUAGE internal IMMUTABLE STRICT LEAKPROOF PARALLEL SAFE;
CREATE FUNCTION idempotency.role_scope_ne(idempotency.role_scope, idempotency.role_scope)
RETURNS pg_catalog.bool AS 'oidne'
LANGUAGE internal IMMUTABLE STRICT LEAKPROOF PARALLEL SAFE;
CREATE FUNCTION idempotency.role_scope_lt(idempotency.role_scope, idempotency.role_scope)
RETURNS pg_catalog.bool AS 'oidlt'
LANGUAGE internal IMMUTABLE STRICT LEAKPROOF PARALLEL SAFE;
CREATE FUNCTION idempotency.role_scope_le(idempotency.role_scope, idempotency.role_scope)
RETURNS pg_catalog.bool AS 'oidle'
LANGUAGE internal IMMUTABLE STRICT LEAKPROOF PARALLEL SAFE;
CREATE FUNCTION idempotency.role_scope_gt(idempotency.role_scope, idempotency.role_scope)
RETURNS pg_catalog.bool AS 'oidgt'
LANGUAGE internal IMMUTABLE STRICT LEAKPROOF PARALLEL SAFE;
CREATE FUNCTION idempotency.role_scope_ge(idempotency.role_scope, idempotency.role_scope)
RETURNS pg_catalog.bool AS 'oidge'
LANGUAGE internal IMMUTABLE STRICT LEAKPROOF PARALLEL SAFE;
CREATE FUNCTION idempotency.role_scope_cmp(idempotency.role_scope, idempotency.role_scope)
RETURNS pg_catalog.int4 AS 'btoidcmp'
LANGUAGE internal IMMUTABLE STRICT LEAKPROOF PARALLEL SAFE;
CREATE FUNCTION idempotency.role_scope_hash(idempotency.role_scope)
RETURNS pg_catalog.int4 AS 'hashoid'
LANGUAGE internal IMMUTABLE STRICT PARALLEL SAFE;
CREATE FUNCTION idempotency.role_scope_hash_extended(idempotency.role_scope, pg_catalog.int8)
RETURNS pg_catalog.int8 AS 'hashoidextended'
LANGUAGE internal IMMUTABLE STRICT PARALLEL SAFE;

CREATE OPERATOR idempotency.= (
    LEFTARG = idempotency.role_scope, RIGHTARG = idempotency.role_scope,
    FUNCTION = idempotency.role_scope_eq,
    COMMUTATOR = OPERATOR(idempotency.=), NEGATOR = OPERATOR(idempotency.<>),
    RESTRICT = pg_catalog.eqsel, JOIN = pg_catalog.eqjoinsel,
    HASHES, MERGES);
CREATE OPERATOR idempotency.<> (
    LEFTARG = idempotency.role_scope, RIGHTARG = idempotency.role_scope,
    FUNCTION = idempotency.role_scope_ne,
    COMMUTATOR = OPERATOR(idempotency.<>), NEGATOR = OPERATOR(idempotency.=),
    RESTRICT = pg_catalog.neqsel, JOIN = pg_catalog.neqjoinsel);
CREATE OPERATOR idempotency.< (
    LEFTARG = idempotency.role_scope, RIGHTARG = idempotency.role_scope,
    FUNCTION = idempotency.role_scope_lt,
    COMMUTATOR = OPERATOR(idempotency.>), NEGATOR = OPERATOR(idempotency.>=),
    RESTRICT = pg_catalog.scalarltsel, JOIN = pg_catalog.scalarltjoinsel);
CREATE OPERATOR idempotency.<= (
    LEFTARG = idempotency.role_scope, RIGHTARG = idempotency.role_scope,
    FUNCTION = idempotency.role_scope_le,
    COMMUTATOR = OPERATOR(idempotency.>=), NEGATOR = OPERATOR(idempotency.>),
    RESTRICT = pg_catalog.scalarlesel, JOIN = pg_catalog.scalarlejoinsel);
CREATE OPERATOR idempotency.> (
    LEFTARG = idempotency.role_scope, RIGHTARG = idempotency.role_scope,
    FUNCTION = idempotency.role_scope_gt,
    COMMUTATOR = OPERATOR(idempotency.<), NEGATOR = OPERATOR(idempotency.<=),
    RESTRICT = pg_catalog.scalargtsel, JOIN = pg_catalog.scalargtjoinsel);
CREATE OPERATOR idempotency.>= (
    LEFTARG = idempotency.role_scope, RIGHTARG = idempotency.role_scope,
    FUNCTION = idempotency.role_scope_ge,
    COMMUTATOR = OPERATOR(idempotency.<=), NEGATOR = OPERATOR(idempotency.<),
    RESTRICT = pg_catalog.scalargesel, JOIN = pg_catalog.scalargejoinsel);

-- The primary key's opclass. Sort support and equal images are oid's too:
-- fast index builds and B-tree deduplication.
CREATE OPERATOR CLASS idempotency.role_scope_ops
    DEFAULT FOR TYPE idempotency.role_scope USING btree AS
        OPERATOR 1 idempotency.<,
        OPERATOR 2 idempotency.<=,
        OPERATOR 3 idempotency.=,
        OPERATOR 4 idempotency.>=,
        OPERATOR 5 idempotency.>,
        FUNCTION 1 idempotency.role_scope_cmp(idempotency.role_scope, idempotency.role_scope),
        FUNCTION 2 pg_catalog.btoidsortsupport(pg_catalog.internal),
        FUNCTION 4 pg_catalog.btequalimage(pg_catalog.oid);

CREATE OPERATOR CLASS idempotency.role_scope_ops
    DEFAULT FOR TYPE idempotency.role_scope USING hash AS
        OPERATOR 1 idempotency.=,
        FUNCTION 1 idempotency.role_scope_hash(idempotency.role_scope),
        FUNCTION 2 idempotency.role_scope_hash_extended(idempotency.role_scope, pg_catalog.int8);

-- Within one cluster a regrole and a role scope are the same OID. Assignment
-- only: a regrole value is stored as a scope (INSERTs that write regrole
-- values, dumps of versions whose scope was a regrole), but comparisons are
-- between scopes.
CREATE CAST (pg_catalog.regrole AS idempotency.role_scope)
    WITHOUT FUNCTION AS ASSIGNMENT;
CREATE CAST (idempotency.role_scope AS pg_catalog.regrole)
    WITHOUT FUNCTION;

-- The calling role; a key's scope. Used by the row-level security policy.
CREATE FUNCTION idempotency.current_scope()
RETURNS idempotency.role_scope
AS 'MODULE_PATHNAME', 'idempotency_current_scope'
LANGUAGE C STABLE STRICT PARALLEL SAFE;

-- A key's digest --------------------------------------------------------------
--
-- The primary key holds a digest of the key, not its text: an entry of
-- (scope, key_digest) stays small whatever the key's length, and so do the
-- index and the full-page images new keys cost in the WAL. The digest
-- follows the key's own order when the key has one, so that each series is
-- appended at its own edge of the index: a UUIDv7 gives its 48-bit
-- millisecond timestamp and 8 bytes of SHA-256; a key ending in 6 to 18
-- digits after a prefix that is not a hex string (`order-000000123`) gives
-- 8 bytes of SHA-256 over its prefix and digit count, then its number. Any
-- other key gives the first 11 bytes of SHA-256. Each is taken over the
-- key's UTF-8 form, which every node computes alike in any database
-- encoding; the key's text stays in the row, and every lookup compares it.
CREATE FUNCTION idempotency.key_digest(key pg_catalog.text)
RETURNS pg_catalog.bytea
AS 'MODULE_PATHNAME', 'idempotency_ordered_key_digest'
LANGUAGE C IMMUTABLE STRICT PARALLEL SAFE;

COMMENT ON FUNCTION idempotency.key_digest(pg_catalog.text) IS
    'the digest of an idempotency key, as keys.key_digest holds it (in the key''s order for UUIDv7 and keys ending in a number): find a key with WHERE key_digest = idempotency.key_digest(''...'')';

-- The expiry index's order ----------------------------------------------------
--
-- EXPLAIN ANALYZE shows what a scan read before row-level security removed
-- other roles' rows. Had the planner used keys_expires_at_idx for a caller's
-- `expires_at < $t`, `ORDER BY expires_at` or `min(expires_at)`, "Rows
-- Removed by Filter" would count the keys of all other roles that expire
-- before $t. The index is built with an operator class of its own, in a
-- family of its own: the planner matches no comparison or ordering of the
-- built-in timestamptz operators to it, and callers cannot use its operators
-- (only superusers may execute their functions). The order is timestamptz's
-- (the same built-in functions), and the expiry worker scans the index
-- directly with the built-in comparisons.
--
-- The functions are copies of the server's timestamp_* for their rights
-- alone: EXECUTE on them is revoked from PUBLIC, which keeps every caller
-- from the family's operators, and the built-in functions' rights cannot
-- be revoked without taking timestamptz comparison from everyone. In
-- everything else they are the server's functions, LEAKPROOF as those are
-- (catalog checks such as PostgreSQL's opr_sanity compare every copy of an
-- internal function with the server's). The operators have timestamptz's
-- estimators, and the equality merge joins, as a B-tree family's must.
CREATE FUNCTION idempotency.expiry_lt(pg_catalog.timestamptz, pg_catalog.timestamptz)
RETURNS pg_catalog.bool AS 'timestamp_lt'
LANGUAGE internal IMMUTABLE STRICT LEAKPROOF PARALLEL SAFE;
CREATE FUNCTION idempotency.expiry_le(pg_catalog.timestamptz, pg_catalog.timestamptz)
RETURNS pg_catalog.bool AS 'timestamp_le'
LANGUAGE internal IMMUTABLE STRICT LEAKPROOF PARALLEL SAFE;
CREATE FUNCTION idempotency.expiry_eq(pg_catalog.timestamptz, pg_catalog.timestamptz)
RETURNS pg_catalog.bool AS 'timestamp_eq'
LANGUAGE internal IMMUTABLE STRICT LEAKPROOF PARALLEL SAFE;
CREATE FUNCTION idempotency.expiry_ge(pg_catalog.timestamptz, pg_catalog.timestamptz)
RETURNS pg_catalog.bool AS 'timestamp_ge'
LANGUAGE internal IMMUTABLE STRICT LEAKPROOF PARALLEL SAFE;
CREATE FUNCTION idempotency.expiry_gt(pg_catalog.timestamptz, pg_catalog.timestamptz)
RETURNS pg_catalog.bool AS 'timestamp_gt'
LANGUAGE internal IMMUTABLE STRICT LEAKPROOF PARALLEL SAFE;
CREATE FUNCTION idempotency.expiry_cmp(pg_catalog.timestamptz, pg_catalog.timestamptz)
RETURNS pg_catalog.int4 AS 'timestamp_cmp'
LANGUAGE internal IMMUTABLE STRICT LEAKPROOF PARALLEL SAFE;

REVOKE ALL ON FUNCTION
    idempotency.expiry_lt(pg_catalog.timestamptz, pg_catalog.timestamptz),
    idempotency.expiry_le(pg_catalog.timestamptz, pg_catalog.timestamptz),
    idempotency.expiry_eq(pg_catalog.timestamptz, pg_catalog.timestamptz),
    idempotency.expiry_ge(pg_catalog.timestamptz, pg_catalog.timestamptz),
    idempotency.expiry_gt(pg_catalog.timestamptz, pg_catalog.timestamptz),
    idempotency.expiry_cmp(pg_catalog.timestamptz, pg_catalog.timestamptz)
  FROM PUBLIC;

-- Named after text_pattern_ops' operators, not `<`: a search_path that puts
-- this schema before pg_catalog must not turn callers' comparisons into these.
CREATE OPERATOR idempotency.~<~ (
    LEFTARG = pg_catalog.timestamptz, RIGHTARG = pg_catalog.timestamptz,
    FUNCTION = idempotency.expiry_lt,
    RESTRICT = pg_catalog.scalarltsel, JOIN = pg_catalog.scalarltjoinsel);
CREATE OPERATOR idempotency.~<=~ (
    LEFTARG = pg_catalog.timestamptz, RIGHTARG = pg_catalog.timestamptz,
    FUNCTION = idempotency.expiry_le,
    RESTRICT = pg_catalog.scalarlesel, JOIN = pg_catalog.scalarlejoinsel);
CREATE OPERATOR idempotency.~=~ (
    LEFTARG = pg_catalog.timestamptz, RIGHTARG = pg_catalog.timestamptz,
    FUNCTION = idempotency.expiry_eq,
    COMMUTATOR = OPERATOR(idempotency.~=~),
    RESTRICT = pg_catalog.eqsel, JOIN = pg_catalog.eqjoinsel, MERGES);
CREATE OPERATOR idempotency.~>=~ (
    LEFTARG = pg_catalog.timestamptz, RIGHTARG = pg_catalog.timestamptz,
    FUNCTION = idempotency.expiry_ge,
    RESTRICT = pg_catalog.scalargesel, JOIN = pg_catalog.scalargejoinsel);
CREATE OPERATOR idempotency.~>~ (
    LEFTARG = pg_catalog.timestamptz, RIGHTARG = pg_catalog.timestamptz,
    FUNCTION = idempotency.expiry_gt,
    RESTRICT = pg_catalog.scalargtsel, JOIN = pg_catalog.scalargtjoinsel);

-- Sort support and equal images are timestamptz's: fast index builds and
-- B-tree deduplication, as with the default operator class.
CREATE OPERATOR CLASS idempotency.expiry_ops
    FOR TYPE pg_catalog.timestamptz USING btree AS
        OPERATOR 1 idempotency.~<~,
        OPERATOR 2 idempotency.~<=~,
        OPERATOR 3 idempotency.~=~,
        OPERATOR 4 idempotency.~>=~,
        OPERATOR 5 idempotency.~>~,
        FUNCTION 1 idempotency.expiry_cmp(pg_catalog.timestamptz, pg_catalog.timestamptz),
        FUNCTION 2 pg_catalog.timestamp_sortsupport(pg_catalog.internal),
        FUNCTION 4 pg_catalog.btequalimage(pg_catalog.oid);

COMMENT ON OPERATOR CLASS idempotency.expiry_ops USING btree IS
    'timestamptz order of keys_expires_at_idx, which the planner never uses for a query';

-- The key table ---------------------------------------------------------------
--
-- One row per (scope, key). A row is written once, when the call that
-- claimed the key is done, in the caller's transaction; it becomes visible
-- to others when that transaction commits. While the claiming transaction
-- is open, other callers see the key as in progress (IK409).
-- idempotent_call and complete are the only writers and enforce the key's
-- size (1 to 255 bytes of UTF-8) themselves: rows are written straight to
-- the heap and its indexes, without CHECK constraints to evaluate on every
-- call.
--
-- request_hash is the request's fingerprint, 32 raw bytes. status is
-- always NULL: dumps of 0.7 and 1.0 name it.
-- A call writes its row without trailing NULL columns, so status costs its
-- row nothing. expired_at is NULL for a live key. When a key's response
-- expires, expiry replaces its row with a tombstone: the key's text empty,
-- response NULL, expired_at when the response expired, expires_at when the
-- tombstone goes (expired_at + remember_for). remember_for is how long
-- after its TTL a key is remembered, fixed with the TTL when the key is
-- claimed (idempotency.remember then, as exact time): the caller's answer
-- and expiry's tombstone end the window at the same instant whatever their
-- own settings (docs/expiry.md#when-a-keys-windows-are-fixed).

CREATE TABLE idempotency.keys (
    scope        idempotency.role_scope NOT NULL,
    key          pg_catalog.text COLLATE "C" NOT NULL,
    request_hash pg_catalog.bytea       NOT NULL,
    response     pg_catalog.jsonb,
    created_at   pg_catalog.timestamptz NOT NULL,
    expires_at   pg_catalog.timestamptz NOT NULL,
    key_digest   pg_catalog.bytea       NOT NULL,
    status       pg_catalog.text,
    expired_at   pg_catalog.timestamptz,
    remember_for pg_catalog.interval,
    CONSTRAINT keys_pkey PRIMARY KEY (scope, key_digest)
);

COMMENT ON TABLE idempotency.keys IS
    'processed idempotency keys with their stored responses; written only through idempotency.idempotent_call and idempotency.complete';
COMMENT ON COLUMN idempotency.keys.key_digest IS
    'idempotency.key_digest(key): what the primary key holds in place of the key''s text';
COMMENT ON COLUMN idempotency.keys.status IS
    'always NULL: accepts the status column that dumps of 0.7 and 1.0 name';
COMMENT ON COLUMN idempotency.keys.expired_at IS
    'NULL for a live key; for a tombstone (response NULL, key empty), when its response expired: until expires_at a retry of its request gets IK410';
COMMENT ON COLUMN idempotency.keys.remember_for IS
    'how long after expires_at a live key is remembered as a tombstone (idempotency.remember when it was claimed, as exact time); NULL: 7 days';

-- pg_dump keeps the keys.
SELECT pg_catalog.pg_extension_config_dump('idempotency.keys', '');

-- Row-level security hides other roles' rows, but the planner may still use
-- the table's statistics for leakproof operators such as text comparisons:
-- row estimates of EXPLAIN would tell any role the text of other roles' keys
-- (a binary search over `key < 'm'`) and how many keys a role holds
-- (`scope = ...`). No statistics are gathered for any column of the table,
-- so estimates come from the table's size alone (pg_class.reltuples, which
-- PostgreSQL shows every role anyway). Calls and the expiry worker never
-- plan a query on the table; the statistics views count with a scan.
ALTER TABLE idempotency.keys
    ALTER COLUMN scope SET STATISTICS 0,
    ALTER COLUMN key SET STATISTICS 0,
    ALTER COLUMN request_hash SET STATISTICS 0,
    ALTER COLUMN response SET STATISTICS 0,
    ALTER COLUMN created_at SET STATISTICS 0,
    ALTER COLUMN expires_at SET STATISTICS 0,
    ALTER COLUMN key_digest SET STATISTICS 0,
    ALTER COLUMN status SET STATISTICS 0,
    ALTER COLUMN expired_at SET STATISTICS 0,
    ALTER COLUMN remember_for SET STATISTICS 0;

-- Callers may read their own keys and nothing else; they write only through
-- idempotent_call and complete, which store rows with the table owner's
-- rights.
REVOKE ALL ON TABLE idempotency.keys FROM PUBLIC;
GRANT SELECT ON TABLE idempotency.keys TO PUBLIC;
ALTER TABLE idempotency.keys ENABLE ROW LEVEL SECURITY;
CREATE POLICY keys_own_scope ON idempotency.keys FOR SELECT TO PUBLIC
    USING (scope OPERATOR(idempotency.=) idempotency.current_scope());

-- A key's TTL is fixed when it is claimed: expires_at = created_at + the
-- idempotency.ttl in force then, so expiry goes by expires_at. The index is
-- expiry's access path: each pass of a round goes on in it from where the
-- last one stopped, so a round reads only expired keys, whatever the
-- table's size (docs/keys.md compares it with BRIN and partitions).
CREATE INDEX keys_expires_at_idx ON idempotency.keys
    (expires_at idempotency.expiry_ops);

-- Rows that arrive without idempotent_call: pg_restore of a dump, COPY,
-- logical replication. A BEFORE INSERT row trigger computes key_digest from
-- the key, and refuses a row whose request_hash is not a fingerprint (a
-- dump made before 0.4). idempotent_call writes every column itself: its
-- store leaves the trigger out, so a call never runs it. ALWAYS: logical
-- replication's apply runs it too (a publisher of another encoding or
-- version).
CREATE FUNCTION idempotency.keys_loaded()
RETURNS trigger
AS 'MODULE_PATHNAME', 'idempotency_ordered_keys_loaded'
LANGUAGE C;

COMMENT ON FUNCTION idempotency.keys_loaded() IS
    'fills key_digest for rows loaded into idempotency.keys by COPY or INSERT';

REVOKE ALL ON FUNCTION idempotency.keys_loaded() FROM PUBLIC;

CREATE TRIGGER keys_loaded BEFORE INSERT ON idempotency.keys
    FOR EACH ROW EXECUTE FUNCTION idempotency.keys_loaded();
ALTER TABLE idempotency.keys ENABLE ALWAYS TRIGGER keys_loaded;

-- Tombstones (docs/expiry.md) are rows of idempotency.keys too, with the
-- key's text empty and no response. NOT NULL on response, or a unique index
-- over the key's text that does not leave them out (WHERE expired_at IS
-- NULL), would refuse every tombstone or a role's second one: such a change
-- of the table is refused when it is made (docs/maintenance.md). Unique
-- indexes with a predicate are the DBA's to get right; expiry keeps, and
-- reports, a row whose tombstone they refuse.
CREATE FUNCTION idempotency.refuse_tombstone_conflicts()
RETURNS event_trigger
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
  keys pg_catalog.oid := pg_catalog.to_regclass('idempotency.keys');
  refused pg_catalog.text;
BEGIN
  IF keys IS NULL OR NOT EXISTS (
       SELECT FROM pg_catalog.pg_event_trigger_ddl_commands() AS c
        WHERE c.objid OPERATOR(pg_catalog.=) keys
           OR c.objid IN (SELECT i.indexrelid FROM pg_catalog.pg_index AS i
                           WHERE i.indrelid OPERATOR(pg_catalog.=) keys)) THEN
    RETURN;
  END IF;
  IF EXISTS (SELECT FROM pg_catalog.pg_attribute AS a
              WHERE a.attrelid OPERATOR(pg_catalog.=) keys
                AND a.attname OPERATOR(pg_catalog.=) 'response'
                AND a.attnotnull) THEN
    RAISE EXCEPTION 'idempotency.keys.response may not be NOT NULL'
      USING ERRCODE = '0A000',
            DETAIL = 'The tombstone an expired key leaves has no response.',
            HINT = 'To require a response of every live key, add CHECK (response IS NOT NULL OR expired_at IS NOT NULL).';
  END IF;
  SELECT i.indexrelid::pg_catalog.regclass::pg_catalog.text INTO refused
    FROM pg_catalog.pg_index AS i
    JOIN pg_catalog.pg_attribute AS a
      ON a.attrelid OPERATOR(pg_catalog.=) keys
     AND a.attname OPERATOR(pg_catalog.=) 'key'
   WHERE i.indrelid OPERATOR(pg_catalog.=) keys
     AND i.indisunique
     AND i.indpred IS NULL
     AND (a.attnum OPERATOR(pg_catalog.=) ANY (i.indkey)
          OR EXISTS (SELECT FROM pg_catalog.pg_depend AS d
                      WHERE d.classid OPERATOR(pg_catalog.=) 'pg_catalog.pg_class'::pg_catalog.regclass
                        AND d.objid OPERATOR(pg_catalog.=) i.indexrelid
                        AND d.refclassid OPERATOR(pg_catalog.=) 'pg_catalog.pg_class'::pg_catalog.regclass
                        AND d.refobjid OPERATOR(pg_catalog.=) keys
                        AND d.refobjsubid OPERATOR(pg_catalog.=) a.attnum))
   LIMIT 1;
  IF refused IS NOT NULL THEN
    RAISE EXCEPTION 'unique index % on idempotency.keys would refuse tombstones', refused
      USING ERRCODE = '0A000',
            DETAIL = 'The tombstones expired keys leave all have an empty key text.',
            HINT = 'Leave them out of the index: WHERE expired_at IS NULL.';
  END IF;
END
$$;

COMMENT ON FUNCTION idempotency.refuse_tombstone_conflicts() IS
    'refuses NOT NULL on idempotency.keys.response and unique indexes over its key text that would refuse tombstones';

REVOKE ALL ON FUNCTION idempotency.refuse_tombstone_conflicts() FROM PUBLIC;

CREATE EVENT TRIGGER idempotency_refuse_tombstone_conflicts ON ddl_command_end
    WHEN TAG IN ('ALTER TABLE', 'CREATE INDEX')
    EXECUTE FUNCTION idempotency.refuse_tombstone_conflicts();

-- A role that has keys cannot be dropped --------------------------------------
--
-- A key is stored under its role's OID, and a role created after a DROP
-- ROLE may get that OID again (after OID wraparound, or pg_resetwal -o).
-- The first time a role stores (or a restore loads) a key in a database,
-- the library records a shared dependency of idempotency.keys (its column
-- scope) on the role, as for the privileges a role holds: DROP ROLE then
-- fails with 2BP01 while the role has keys in any database. DROP OWNED BY,
-- in each database, deletes the role's keys there and that dependency,
-- through this event trigger; REASSIGN OWNED leaves them.
CREATE FUNCTION idempotency.drop_owned_keys()
RETURNS event_trigger
AS 'MODULE_PATHNAME', 'idempotency_drop_owned_keys'
LANGUAGE C;

COMMENT ON FUNCTION idempotency.drop_owned_keys() IS
    'deletes the idempotency keys of the roles that DROP OWNED names, in this database, with their tenant keys on this Citus node';

REVOKE ALL ON FUNCTION idempotency.drop_owned_keys() FROM PUBLIC;

CREATE EVENT TRIGGER idempotency_drop_owned_keys ON ddl_command_start
    WHEN TAG IN ('DROP OWNED')
    EXECUTE FUNCTION idempotency.drop_owned_keys();
-- Also with session_replication_role = replica.
ALTER EVENT TRIGGER idempotency_drop_owned_keys ENABLE ALWAYS;

-- GRANT and REVOKE: PostgreSQL deletes the ACL dependencies of every role
-- that leaves the privileges of a table's column - a REVOKE on the column,
-- on the table, on all tables of its schema, or a grant a REVOKE ...
-- CASCADE takes - and a role's record on keys.scope is one. At the end of
-- each GRANT or REVOKE that names a key table (or all tables of its
-- schema), this event trigger records again the missing ones of the roles
-- that have keys in it.
CREATE FUNCTION idempotency.keep_role_marks()
RETURNS event_trigger
AS 'MODULE_PATHNAME', 'idempotency_keep_role_marks'
LANGUAGE C;

COMMENT ON FUNCTION idempotency.keep_role_marks() IS
    'records again, after a GRANT or REVOKE on a key table, that the roles with keys in it have them (so DROP ROLE still refuses them)';

REVOKE ALL ON FUNCTION idempotency.keep_role_marks() FROM PUBLIC;

CREATE EVENT TRIGGER idempotency_keep_role_marks ON ddl_command_end
    WHEN TAG IN ('GRANT', 'REVOKE')
    EXECUTE FUNCTION idempotency.keep_role_marks();
-- Also with session_replication_role = replica.
ALTER EVENT TRIGGER idempotency_keep_role_marks ENABLE ALWAYS;

-- The expiry worker runs it each round (pg_upgrade and restores do not
-- carry the dependencies).
CREATE FUNCTION idempotency.mark_key_roles()
RETURNS pg_catalog.int8
AS 'MODULE_PATHNAME', 'idempotency_mark_key_roles'
LANGUAGE C VOLATILE STRICT;

COMMENT ON FUNCTION idempotency.mark_key_roles() IS
    'records that every role with keys in this database, or tenant keys on this Citus node, has them (so DROP ROLE refuses it), and deletes the keys of roles that no longer exist; returns the number of keys deleted';

REVOKE ALL ON FUNCTION idempotency.mark_key_roles() FROM PUBLIC;

-- The call ----------------------------------------------------------------------

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

-- The application API -----------------------------------------------------------
--
-- Claim a key in the handler's own transaction, do the work in application
-- code, complete it with the response. Same key table, same claim mechanism
-- and same rules (IK409, IK422, wait_timeout, TTL, per-role scope) as
-- idempotent_call. Also: idempotent_call's outcome with times, and
-- lookup/forget of the caller's own keys for support tooling.

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

-- Many keys in one statement, for queue consumers that take messages in
-- batches (docs/application-api.md#many-keys-in-one-statement): claim() of
-- each key, in the caller's transaction, one answer row per key in the order
-- given (ordinality 1 ... n). outcome is claimed (this transaction holds the
-- key), replayed (response and times of the stored row) or refused: the key's
-- error of class IK (IK409, IK422, ...) as sqlstate and message, while the
-- other keys' claims stand. Any other error (a NULL, empty or too long key,
-- arrays of different lengths: 22004, 22023) ends the statement. Keys are
-- taken in the order of their digests, so that two batches sharing keys
-- never wait on each other in a cycle; a key given twice is refused IK508 at
-- its later occurrence while the first holds it.
CREATE FUNCTION idempotency.claim_batch(keys pg_catalog.text[],
                                        request_hashes pg_catalog.text[])
RETURNS TABLE (ordinality pg_catalog.int4, key pg_catalog.text,
               outcome pg_catalog.text, sqlstate pg_catalog.text,
               message pg_catalog.text, response pg_catalog.jsonb,
               created_at pg_catalog.timestamptz, expires_at pg_catalog.timestamptz)
AS 'MODULE_PATHNAME', 'idempotency_claim_batch'
LANGUAGE C VOLATILE CALLED ON NULL INPUT PARALLEL UNSAFE SECURITY INVOKER ROWS 100;

COMMENT ON FUNCTION idempotency.claim_batch(pg_catalog.text[], pg_catalog.text[]) IS
    'claim many idempotency keys in this transaction: per key claimed, replayed (with its response) or refused (its IK sqlstate); complete or release each claimed key before COMMIT';

-- complete() of each key, in the order given, with responses[i] for
-- keys[i]; the first that fails ends the statement (55000 for a key this
-- transaction does not hold).
CREATE FUNCTION idempotency.complete_batch(keys pg_catalog.text[],
                                           responses pg_catalog.jsonb[])
RETURNS pg_catalog.void
AS 'MODULE_PATHNAME', 'idempotency_complete_batch'
LANGUAGE C VOLATILE CALLED ON NULL INPUT PARALLEL UNSAFE SECURITY INVOKER;

COMMENT ON FUNCTION idempotency.complete_batch(pg_catalog.text[], pg_catalog.jsonb[]) IS
    'store the responses of many keys this transaction claimed, responses[i] for keys[i]';

-- The last idempotent_call or claim of this session: ran, replayed,
-- stored_error or replayed_error, with the stored row's times. No row before
-- the first call, or after a call that failed.
CREATE FUNCTION idempotency.last_call()
RETURNS TABLE (outcome pg_catalog.text, created_at pg_catalog.timestamptz,
               expires_at pg_catalog.timestamptz)
AS 'MODULE_PATHNAME', 'idempotency_last_call'
LANGUAGE C VOLATILE PARALLEL RESTRICTED ROWS 1;

-- The state of one of the caller's own keys: absent, in_progress, done,
-- gone (its response expired; a retry of its request gets IK410) or
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

-- Keys for downstream calls ------------------------------------------------------
--
-- idempotency.derived_key(key, label): the key of a call the handler makes
-- outside the database (a provider's Idempotency-Key, an e-mail's message
-- id, an outbox row's key), the same on every retry of the request, for the
-- same role (docs/downstream.md). It is an HMAC under this database's
-- secret, one row of 32 random bytes that must outlive everything a
-- retry may follow: the table is data (WAL, standbys, pg_upgrade), and
-- pg_dump keeps its row. Only its owner has rights on it; derived_key reads
-- it without them. A superuser may rotate it with an UPDATE, which changes
-- every derived key.
CREATE TABLE idempotency.derived_key_secret (
    secret pg_catalog.bytea NOT NULL
        CONSTRAINT derived_key_secret_size
        CHECK (pg_catalog.octet_length(secret) OPERATOR(pg_catalog.=) 32)
);
CREATE UNIQUE INDEX derived_key_secret_one_row
    ON idempotency.derived_key_secret ((true));

COMMENT ON TABLE idempotency.derived_key_secret IS
    'the secret of idempotency.derived_key in this database, one row; changing it changes every derived key';

REVOKE ALL ON TABLE idempotency.derived_key_secret FROM PUBLIC;

-- A row inserted takes the place of the one there: a restore's data (COPY)
-- then replaces the secret CREATE EXTENSION drew. ALWAYS: logical
-- replication's apply and session_replication_role = replica too.
CREATE FUNCTION idempotency.derived_key_secret_replaced()
RETURNS trigger
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
  DELETE FROM idempotency.derived_key_secret;
  RETURN NEW;
END
$$;

COMMENT ON FUNCTION idempotency.derived_key_secret_replaced() IS
    'makes a row inserted into idempotency.derived_key_secret replace the one there (a restore''s)';

REVOKE ALL ON FUNCTION idempotency.derived_key_secret_replaced() FROM PUBLIC;

CREATE TRIGGER derived_key_secret_replaced BEFORE INSERT
    ON idempotency.derived_key_secret
    FOR EACH ROW EXECUTE FUNCTION idempotency.derived_key_secret_replaced();
ALTER TABLE idempotency.derived_key_secret
    ENABLE ALWAYS TRIGGER derived_key_secret_replaced;

-- 256 bits from the server's strong random source: PostgreSQL's core has
-- no random bytes function but gen_random_uuid() (pg_strong_random, 122
-- random bits each), whose three are hashed to 32 bytes.
INSERT INTO idempotency.derived_key_secret (secret)
SELECT pg_catalog.sha256(pg_catalog.uuid_send(pg_catalog.gen_random_uuid())
                         OPERATOR(pg_catalog.||) pg_catalog.uuid_send(pg_catalog.gen_random_uuid())
                         OPERATOR(pg_catalog.||) pg_catalog.uuid_send(pg_catalog.gen_random_uuid()));

-- pg_dump keeps the secret.
SELECT pg_catalog.pg_extension_config_dump('idempotency.derived_key_secret', '');

-- STABLE: it depends on the current role and the secret. The key and the
-- label are checked like a call's key: 22004 when NULL, 22023 when empty
-- or over 255 bytes of UTF-8.
CREATE FUNCTION idempotency.derived_key(key pg_catalog.text, label pg_catalog.text)
RETURNS pg_catalog.text
AS 'MODULE_PATHNAME', 'idempotency_derived_key'
LANGUAGE C STABLE CALLED ON NULL INPUT PARALLEL SAFE SECURITY INVOKER;

COMMENT ON FUNCTION idempotency.derived_key(pg_catalog.text, pg_catalog.text) IS
    'the key for a call made outside the database while handling key: the same for the same role, key and label on every retry; a UUID (version 8) no other role can compute';

-- Expiry ------------------------------------------------------------------------

-- One expiry round in this database, now, in the caller's transaction;
-- returns how many keys it deleted. It deletes the keys of every role, so
-- only superusers may run it, and roles they grant EXECUTE to.
CREATE FUNCTION idempotency.expire()
RETURNS pg_catalog.int8
AS 'MODULE_PATHNAME', 'idempotency_expire'
LANGUAGE C VOLATILE PARALLEL UNSAFE;

COMMENT ON FUNCTION idempotency.expire() IS
    'deletes the keys of this database that are past their TTL (each replaced by its tombstone while idempotency.remember keeps it) and the tombstones past that, in the caller''s transaction; returns how many rows it deleted';

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
    OUT failed_rounds pg_catalog.int8,
    OUT last_kept pg_catalog.int8,
    OUT last_kept_reason pg_catalog.text,
    OUT skipped_rounds pg_catalog.int8)
RETURNS SETOF record
AS 'MODULE_PATHNAME', 'idempotency_expiry_status'
LANGUAGE C VOLATILE PARALLEL RESTRICTED;

CREATE VIEW idempotency.expiry_status AS
    SELECT s.datid, d.datname, s.running_since, s.last_started,
           s.last_finished,
           s.last_finished OPERATOR(pg_catalog.-) s.last_started AS last_duration,
           s.last_deleted, s.last_error, s.rounds, s.total_deleted,
           s.failed_rounds, s.last_kept, s.last_kept_reason, s.skipped_rounds
      FROM idempotency.expiry_status() AS s
      LEFT JOIN pg_catalog.pg_database AS d
        ON d.oid OPERATOR(pg_catalog.=) s.datid;

COMMENT ON VIEW idempotency.expiry_status IS
    'the expiry worker''s last round in each database where the extension is installed: when, how long, keys deleted, keys kept, error';

-- Monitoring roles may watch the worker.
REVOKE ALL ON FUNCTION idempotency.expiry_status() FROM PUBLIC;
REVOKE ALL ON idempotency.expiry_status FROM PUBLIC;
GRANT EXECUTE ON FUNCTION idempotency.expiry_status() TO pg_monitor;
GRANT SELECT ON idempotency.expiry_status TO pg_monitor;

-- Tenant keys (Citus) -----------------------------------------------------------
--
-- On a Citus cluster whose business tables are distributed by a tenant
-- column, idempotency.tenant_keys keeps each tenant's keys in the shard
-- beside that tenant's rows: a request delegated to the node that holds the
-- tenant runs its claim, its work and its key as one local transaction there.
-- A superuser creates the table once, on the coordinator, co-located with a
-- distributed table; its tenant column takes the type of that table's
-- distribution column. The table is not part of the extension: it holds
-- data, and pg_dump keeps it with the business tables. Callers have no
-- rights on it; the tenant_* functions read and write it as its owner.
CREATE FUNCTION idempotency.distribute_keys(colocate_with pg_catalog.regclass)
RETURNS pg_catalog.regclass
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
  tenant_type pg_catalog.regtype;
BEGIN
  IF pg_catalog.to_regclass('pg_catalog.pg_dist_partition') IS NULL THEN
    RAISE EXCEPTION 'Citus is not installed in this database'
      USING ERRCODE = '0A000',
            HINT = 'Tenant keys are for Citus clusters: CREATE EXTENSION citus first.';
  END IF;
  IF pg_catalog.to_regclass('idempotency.tenant_keys') IS NOT NULL THEN
    RAISE EXCEPTION 'idempotency.tenant_keys already exists'
      USING ERRCODE = '42P07';
  END IF;
  SELECT a.atttypid INTO tenant_type
    FROM pg_catalog.pg_dist_partition AS p
    JOIN pg_catalog.pg_attribute AS a
      ON a.attrelid OPERATOR(pg_catalog.=) p.logicalrelid
     AND a.attname OPERATOR(pg_catalog.=)
         pg_catalog.column_to_column_name(p.logicalrelid, p.partkey)
   WHERE p.logicalrelid OPERATOR(pg_catalog.=) colocate_with
     AND p.partmethod OPERATOR(pg_catalog.=) 'h';
  IF NOT FOUND THEN
    RAISE EXCEPTION '% is not a hash-distributed Citus table', colocate_with
      USING ERRCODE = '42809',
            HINT = 'Name a table distributed with create_distributed_table(table, column): the keys are co-located with it.';
  END IF;
  EXECUTE pg_catalog.format(
    'CREATE TABLE idempotency.tenant_keys ('
    '  tenant %s NOT NULL,'
    '  scope idempotency.role_scope NOT NULL,'
    '  key pg_catalog.text NOT NULL,'
    '  key_digest pg_catalog.bytea NOT NULL,'
    '  request_hash pg_catalog.bytea NOT NULL,'
    '  response pg_catalog.jsonb,'
    '  created_at pg_catalog.timestamptz NOT NULL,'
    '  expires_at pg_catalog.timestamptz NOT NULL,'
    '  expired_at pg_catalog.timestamptz,'
    '  remember_for pg_catalog.interval,'
    '  PRIMARY KEY (tenant, scope, key_digest))', tenant_type);
  CREATE INDEX tenant_keys_expires_at_idx ON idempotency.tenant_keys (expires_at);
  COMMENT ON TABLE idempotency.tenant_keys IS
    'idempotency keys distributed with the tenants'' data; written only through the idempotency.tenant_* functions';
  REVOKE ALL ON TABLE idempotency.tenant_keys FROM PUBLIC;
  PERFORM pg_catalog.create_distributed_table('idempotency.tenant_keys', 'tenant',
                                              colocate_with => colocate_with::pg_catalog.text);
  RETURN 'idempotency.tenant_keys'::pg_catalog.regclass;
END $$;

COMMENT ON FUNCTION idempotency.distribute_keys(pg_catalog.regclass) IS
    'create idempotency.tenant_keys, distributed by Citus and co-located with the given distributed table';

REVOKE ALL ON FUNCTION idempotency.distribute_keys(pg_catalog.regclass) FROM PUBLIC;

-- idempotent_call for a tenant's key: the same outcomes (replay, IK409,
-- IK422, stored errors), the key kept in idempotency.tenant_keys under
-- (tenant, role, key). tenant must have the type of the tenant column.
CREATE FUNCTION idempotency.tenant_call(
    tenant "any", key pg_catalog.text, request_hash pg_catalog.text, fn pg_catalog.text)
RETURNS pg_catalog.jsonb
AS 'MODULE_PATHNAME', 'idempotency_tenant_call'
LANGUAGE C VOLATILE CALLED ON NULL INPUT PARALLEL UNSAFE SECURITY INVOKER;

CREATE FUNCTION idempotency.tenant_call(
    tenant "any", key pg_catalog.text, request_hash pg_catalog.text, fn pg_catalog.text,
    VARIADIC args "any")
RETURNS pg_catalog.jsonb
AS 'MODULE_PATHNAME', 'idempotency_tenant_call'
LANGUAGE C VOLATILE CALLED ON NULL INPUT PARALLEL UNSAFE SECURITY INVOKER;

-- The application API for a tenant's key.
CREATE FUNCTION idempotency.tenant_claim(
    tenant "any", key pg_catalog.text, request_hash pg_catalog.text)
RETURNS TABLE (replayed pg_catalog.bool, response pg_catalog.jsonb,
               created_at pg_catalog.timestamptz, expires_at pg_catalog.timestamptz)
AS 'MODULE_PATHNAME', 'idempotency_tenant_claim'
LANGUAGE C VOLATILE CALLED ON NULL INPUT PARALLEL UNSAFE SECURITY INVOKER ROWS 1;

CREATE FUNCTION idempotency.tenant_complete(
    tenant "any", key pg_catalog.text, response pg_catalog.jsonb)
RETURNS pg_catalog.void
AS 'MODULE_PATHNAME', 'idempotency_tenant_complete'
LANGUAGE C VOLATILE CALLED ON NULL INPUT PARALLEL UNSAFE SECURITY INVOKER;

CREATE FUNCTION idempotency.tenant_release(tenant "any", key pg_catalog.text)
RETURNS pg_catalog.void
AS 'MODULE_PATHNAME', 'idempotency_tenant_release'
LANGUAGE C VOLATILE CALLED ON NULL INPUT PARALLEL UNSAFE SECURITY INVOKER;

CREATE FUNCTION idempotency.tenant_lookup(tenant "any", key pg_catalog.text)
RETURNS TABLE (state pg_catalog.text, created_at pg_catalog.timestamptz,
               expires_at pg_catalog.timestamptz, response pg_catalog.jsonb)
AS 'MODULE_PATHNAME', 'idempotency_tenant_lookup'
LANGUAGE C VOLATILE CALLED ON NULL INPUT PARALLEL UNSAFE SECURITY INVOKER ROWS 1;

CREATE FUNCTION idempotency.tenant_forget(tenant "any", key pg_catalog.text)
RETURNS pg_catalog.bool
AS 'MODULE_PATHNAME', 'idempotency_tenant_forget'
LANGUAGE C VOLATILE CALLED ON NULL INPUT PARALLEL UNSAFE SECURITY INVOKER;

-- Statistics --------------------------------------------------------------------

-- Counters per database, from shared memory (needs the library preloaded;
-- no rows otherwise).
CREATE FUNCTION idempotency.stats_counters(
    OUT datid pg_catalog.oid,
    OUT calls_ran pg_catalog.int8,
    OUT replays pg_catalog.int8,
    OUT conflicts pg_catalog.int8,
    OUT mismatches pg_catalog.int8,
    OUT keys_expired pg_catalog.int8,
    OUT stats_reset pg_catalog.timestamptz,
    OUT late_retries pg_catalog.int8)
RETURNS SETOF record
AS 'MODULE_PATHNAME', 'idempotency_stats_counters'
LANGUAGE C VOLATILE PARALLEL RESTRICTED;

-- Zeroes this database's counters.
CREATE FUNCTION idempotency.stats_reset()
RETURNS pg_catalog.void
AS 'MODULE_PATHNAME', 'idempotency_stats_reset'
LANGUAGE C VOLATILE PARALLEL RESTRICTED;

-- The number of live tenant keys, the oldest one's creation and the number
-- of tenant tombstones, read through Citus (every shard) as the table's
-- owner; zeros and NULL without the table. For the stats view only.
CREATE FUNCTION idempotency.tenant_key_totals(OUT keys pg_catalog.int8,
                                              OUT oldest pg_catalog.timestamptz,
                                              OUT tombstones pg_catalog.int8)
LANGUAGE plpgsql SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
  keys := 0;
  tombstones := 0;
  IF pg_catalog.to_regclass('idempotency.tenant_keys') IS NOT NULL THEN
    -- CASE rather than FILTER: the aggregates Citus pushes to every shard.
    SELECT pg_catalog.sum(CASE WHEN k.expired_at IS NULL THEN 1 ELSE 0 END),
           pg_catalog.min(CASE WHEN k.expired_at IS NULL THEN k.created_at END),
           pg_catalog.sum(CASE WHEN k.expired_at IS NULL THEN 0 ELSE 1 END)
      INTO keys, oldest, tombstones
      FROM idempotency.tenant_keys AS k;
    keys := coalesce(keys, 0);
    tombstones := coalesce(tombstones, 0);
  END IF;
END $$;

-- One row per database with counters, and always one for this database.
-- keys, oldest_key_age and tombstones are this database's (other
-- databases' tables are out of reach), local and tenant keys together, and
-- read the whole table: a scan, not a lookup. keys and oldest_key_age are
-- the live keys', so that a tombstone kept for idempotency.remember never
-- looks like expiry falling behind. The view runs with its owner's rights,
-- so it counts every role's keys while showing no key or response.
CREATE VIEW idempotency.stats AS
    WITH tenant AS (SELECT * FROM idempotency.tenant_key_totals()),
    local_keys AS (
        SELECT pg_catalog.count(*) FILTER (WHERE k.expired_at IS NULL) AS keys,
               pg_catalog.min(k.created_at) FILTER (WHERE k.expired_at IS NULL) AS oldest,
               pg_catalog.count(*) FILTER (WHERE k.expired_at IS NOT NULL) AS tombstones
          FROM idempotency.keys AS k),
    here AS (
        SELECT d.oid AS datid,
               l.keys OPERATOR(pg_catalog.+) t.keys AS keys,
               pg_catalog.now() OPERATOR(pg_catalog.-)
                   LEAST(l.oldest, t.oldest) AS oldest_key_age,
               l.tombstones OPERATOR(pg_catalog.+) t.tombstones AS tombstones
          FROM pg_catalog.pg_database AS d, local_keys AS l, tenant AS t
         WHERE d.datname OPERATOR(pg_catalog.=) pg_catalog.current_database())
    SELECT coalesce(c.datid, h.datid) AS datid,
           db.datname,
           c.calls_ran, c.replays, c.conflicts, c.mismatches, c.late_retries,
           c.keys_expired, h.keys, h.oldest_key_age, h.tombstones, c.stats_reset
      FROM idempotency.stats_counters() AS c
      FULL JOIN here AS h ON h.datid OPERATOR(pg_catalog.=) c.datid
      LEFT JOIN pg_catalog.pg_database AS db
        ON db.oid OPERATOR(pg_catalog.=) coalesce(c.datid, h.datid);

COMMENT ON VIEW idempotency.stats IS
    'idempotent_call outcomes per database (calls that ran fn, replays, IK409, IK422, IK410), keys deleted by expiry, and this database''s live keys, oldest live key age and tombstones';

-- How many live keys and tombstones each role keeps and how many bytes
-- their rows take (the row as stored, response included, compressed where
-- PostgreSQL compressed it). It runs with its owner's rights, so it counts
-- every role's keys while showing no key or response.
CREATE VIEW idempotency.key_usage AS
    SELECT k.scope::pg_catalog.regrole AS role,
           pg_catalog.count(*) FILTER (WHERE k.expired_at IS NULL) AS keys,
           pg_catalog.sum(pg_catalog.pg_column_size(k.*))::pg_catalog.int8 AS bytes,
           pg_catalog.count(*) FILTER (WHERE k.expired_at IS NOT NULL) AS tombstones
      FROM idempotency.keys AS k
     GROUP BY k.scope;

COMMENT ON VIEW idempotency.key_usage IS
    'live keys, bytes of all rows and tombstones per role in this database, without keys or responses';

-- Monitoring roles may read the statistics; only superusers reset them.
REVOKE ALL ON FUNCTION idempotency.stats_counters() FROM PUBLIC;
REVOKE ALL ON FUNCTION idempotency.stats_reset() FROM PUBLIC;
REVOKE ALL ON FUNCTION idempotency.tenant_key_totals() FROM PUBLIC;
REVOKE ALL ON idempotency.stats FROM PUBLIC;
REVOKE ALL ON idempotency.key_usage FROM PUBLIC;
GRANT EXECUTE ON FUNCTION idempotency.stats_counters() TO pg_monitor;
GRANT EXECUTE ON FUNCTION idempotency.tenant_key_totals() TO pg_monitor;
GRANT SELECT ON idempotency.stats TO pg_monitor;
GRANT SELECT ON idempotency.key_usage TO pg_monitor;
