-- idempotency 0.2 -> 0.3: every change to the key row and the objects around
-- it that this version makes.
\echo Use "ALTER EXTENSION idempotency UPDATE TO '0.3'" to load this file. \quit

-- The key row loses its status column. A row is written once, when its
-- call is done, so status was 'done' in every row; nothing reads it.
-- Dropping a column rewrites no row: every stored key keeps replaying.
-- Whatever a DBA built on the column (a view, an index) goes with it.
ALTER TABLE idempotency.keys DROP COLUMN status CASCADE;

-- Role scope: a key keeps its role across nodes, dumps and renames ----------
--
-- keys.scope was a regrole: the role's OID, which names another role, or
-- none, on a node whose roles were created in another order. Binary-mode
-- logical replication carried the OID as it was, and a dropped role's key
-- was written as a number that another cluster read back as its own role of
-- that OID. idempotency.role_scope keeps the OID inside the cluster (a rename
-- keeps the role's keys; lookups compare 4-byte values as before) and reads
-- and writes the role's name everywhere else - text and binary I/O, so COPY,
-- pg_dump and logical replication in both modes - which each node maps to
-- its own role of that name. A role that no longer exists is written "-" and
-- read back as no role (OID 0), which is never a caller's scope.

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
-- fast index builds and B-tree deduplication, as with the regrole column.
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
-- only: a regrole value is stored as a scope (the column change below,
-- INSERTs that wrote regrole values), but comparisons are between scopes.
CREATE CAST (pg_catalog.regrole AS idempotency.role_scope)
    WITHOUT FUNCTION AS ASSIGNMENT;
CREATE CAST (idempotency.role_scope AS pg_catalog.regrole)
    WITHOUT FUNCTION;

-- The policy and current_scope() are recreated around the new type; the
-- column keeps its OIDs (no table rewrite), its primary key is rebuilt.
DROP POLICY keys_own_scope ON idempotency.keys;
DROP FUNCTION idempotency.current_scope();

ALTER TABLE idempotency.keys
    ALTER COLUMN scope TYPE idempotency.role_scope
    USING scope::idempotency.role_scope;

-- The calling role; a key's scope. Used by the row-level security policy.
CREATE FUNCTION idempotency.current_scope()
RETURNS idempotency.role_scope
AS 'MODULE_PATHNAME', 'idempotency_current_scope'
LANGUAGE C STABLE STRICT PARALLEL SAFE;

CREATE POLICY keys_own_scope ON idempotency.keys FOR SELECT TO PUBLIC
    USING (scope OPERATOR(idempotency.=) idempotency.current_scope());

-- Role isolation: statistics and usage.
--
-- Row-level security hides other roles' rows, but the planner may still use
-- the table's statistics for leakproof operators such as text comparisons:
-- row estimates of EXPLAIN would tell any role the text of other roles' keys
-- (a binary search over `key < 'm'`) and how many keys a role holds
-- (`scope = ...`). No statistics are gathered for any column of the table,
-- and those gathered before are removed, so estimates come from the table's
-- size alone (pg_class.reltuples, which PostgreSQL shows every role
-- anyway). Calls and the expiry worker never plan a query on the table; the
-- statistics view counts with a scan.
DO $$
DECLARE
  col pg_catalog.name;
BEGIN
  FOR col IN
    SELECT a.attname FROM pg_catalog.pg_attribute AS a
     WHERE a.attrelid OPERATOR(pg_catalog.=) 'idempotency.keys'::pg_catalog.regclass
       AND a.attnum OPERATOR(pg_catalog.>) 0 AND NOT a.attisdropped
  LOOP
    EXECUTE pg_catalog.format(
      'ALTER TABLE idempotency.keys ALTER COLUMN %I SET STATISTICS 0', col);
  END LOOP;
END
$$;
DELETE FROM pg_catalog.pg_statistic AS s
 WHERE s.starelid OPERATOR(pg_catalog.=) 'idempotency.keys'::pg_catalog.regclass
    OR s.starelid OPERATOR(pg_catalog.=) ANY (
         SELECT i.indexrelid FROM pg_catalog.pg_index AS i
          WHERE i.indrelid OPERATOR(pg_catalog.=) 'idempotency.keys'::pg_catalog.regclass);

-- How many keys each role keeps and how many bytes their rows take (the
-- row as stored, response included, compressed where PostgreSQL compressed
-- it). It runs with its owner's rights, so it counts every role's keys while
-- showing no key or response; only monitoring roles may read it. It depends
-- on keys.scope, so it comes after any change to that column.
CREATE VIEW idempotency.key_usage AS
    SELECT k.scope::pg_catalog.regrole AS role,
           pg_catalog.count(*) AS keys,
           pg_catalog.sum(pg_catalog.pg_column_size(k.*))::pg_catalog.int8 AS bytes
      FROM idempotency.keys AS k
     GROUP BY k.scope;

COMMENT ON VIEW idempotency.key_usage IS
    'keys and bytes stored per role in this database, without keys or responses';

REVOKE ALL ON idempotency.key_usage FROM PUBLIC;
GRANT SELECT ON idempotency.key_usage TO pg_monitor;

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

-- Role isolation: the expiry index serves the expiry worker only ------------
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
-- directly with the built-in comparisons, so its scans are unchanged.
CREATE FUNCTION idempotency.expiry_lt(pg_catalog.timestamptz, pg_catalog.timestamptz)
RETURNS pg_catalog.bool AS 'timestamp_lt'
LANGUAGE internal IMMUTABLE STRICT PARALLEL SAFE;
CREATE FUNCTION idempotency.expiry_le(pg_catalog.timestamptz, pg_catalog.timestamptz)
RETURNS pg_catalog.bool AS 'timestamp_le'
LANGUAGE internal IMMUTABLE STRICT PARALLEL SAFE;
CREATE FUNCTION idempotency.expiry_eq(pg_catalog.timestamptz, pg_catalog.timestamptz)
RETURNS pg_catalog.bool AS 'timestamp_eq'
LANGUAGE internal IMMUTABLE STRICT PARALLEL SAFE;
CREATE FUNCTION idempotency.expiry_ge(pg_catalog.timestamptz, pg_catalog.timestamptz)
RETURNS pg_catalog.bool AS 'timestamp_ge'
LANGUAGE internal IMMUTABLE STRICT PARALLEL SAFE;
CREATE FUNCTION idempotency.expiry_gt(pg_catalog.timestamptz, pg_catalog.timestamptz)
RETURNS pg_catalog.bool AS 'timestamp_gt'
LANGUAGE internal IMMUTABLE STRICT PARALLEL SAFE;
CREATE FUNCTION idempotency.expiry_cmp(pg_catalog.timestamptz, pg_catalog.timestamptz)
RETURNS pg_catalog.int4 AS 'timestamp_cmp'
LANGUAGE internal IMMUTABLE STRICT PARALLEL SAFE;

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
    FUNCTION = idempotency.expiry_lt);
CREATE OPERATOR idempotency.~<=~ (
    LEFTARG = pg_catalog.timestamptz, RIGHTARG = pg_catalog.timestamptz,
    FUNCTION = idempotency.expiry_le);
CREATE OPERATOR idempotency.~=~ (
    LEFTARG = pg_catalog.timestamptz, RIGHTARG = pg_catalog.timestamptz,
    FUNCTION = idempotency.expiry_eq);
CREATE OPERATOR idempotency.~>=~ (
    LEFTARG = pg_catalog.timestamptz, RIGHTARG = pg_catalog.timestamptz,
    FUNCTION = idempotency.expiry_ge);
CREATE OPERATOR idempotency.~>~ (
    LEFTARG = pg_catalog.timestamptz, RIGHTARG = pg_catalog.timestamptz,
    FUNCTION = idempotency.expiry_gt);

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

DROP INDEX idempotency.keys_expires_at_idx;
CREATE INDEX keys_expires_at_idx ON idempotency.keys
    (expires_at idempotency.expiry_ops);
