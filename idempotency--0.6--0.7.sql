-- idempotency 0.6 -> 0.7. Every object this version adds or changes is
-- also written, as it is now, in idempotency.sql (the fresh install):
-- test/tap/308_install_matches_upgrades.pl fails when the two differ.
\echo Use "ALTER EXTENSION idempotency UPDATE TO '0.7'" to load this file. \quit

-- Ordered key digests --------------------------------------------------------
--
-- The primary key holds (scope, key_digest). Until 0.6 the digest was
-- SHA-256's first 11 bytes for every key, which spreads time-ordered and
-- sequential keys over the whole index like random ones: after each
-- checkpoint nearly every new key then writes a full-page image of its own
-- leaf page (about 3.7 kB of WAL per key in a 10-million-key table). Since
-- 0.7 the digest follows the key's own order when the key has one: a UUIDv7
-- begins with its millisecond timestamp and a key ending in 6 to 18 digits
-- after a prefix that is not a hex string (`order-000000123`) with a hash
-- of its prefix, then its number, so each
-- series is appended at its own edge of the index. Every other key keeps its
-- digest (SHA-256's first 11 bytes), so only the rows of ordered keys
-- change here. Lookups stay one probe of the primary key.
--
-- The table is locked against every other session first: a session that
-- looked a key up by its old digest must not store it under the new one
-- (nor the other way round). The ALTER TABLE at the end makes every
-- session locate the table's columns again, and so learn which digest the
-- table holds. idempotency.tenant_keys keeps its digests: its rows live in
-- Citus shards.
LOCK TABLE idempotency.keys IN ACCESS EXCLUSIVE MODE;

CREATE OR REPLACE FUNCTION idempotency.key_digest(key pg_catalog.text)
RETURNS pg_catalog.bytea
AS 'MODULE_PATHNAME', 'idempotency_ordered_key_digest'
LANGUAGE C IMMUTABLE STRICT PARALLEL SAFE;

COMMENT ON FUNCTION idempotency.key_digest(pg_catalog.text) IS
    'the digest of an idempotency key, as keys.key_digest holds it (in the key''s order for UUIDv7 and keys ending in a number): find a key with WHERE key_digest = idempotency.key_digest(''...'')';

CREATE OR REPLACE FUNCTION idempotency.keys_loaded()
RETURNS trigger
AS 'MODULE_PATHNAME', 'idempotency_ordered_keys_loaded'
LANGUAGE C;

-- A table whose ordered keys are more than a tenth of its rows is
-- rewritten, with its indexes built anew: WAL about the table's size, no
-- dead row versions, a primary key in the digests' order. Otherwise only the
-- rows of ordered keys are updated (a table of random keys writes nothing).
DO $$
DECLARE
    stale pg_catalog.int8;
    total pg_catalog.int8;
BEGIN
    SELECT pg_catalog.count(*) FILTER (WHERE key_digest OPERATOR(pg_catalog.<>) idempotency.key_digest(key)),
           pg_catalog.count(*)
      INTO stale, total
      FROM idempotency.keys;
    IF stale OPERATOR(pg_catalog.>) (total OPERATOR(pg_catalog./) 10) THEN
        ALTER TABLE idempotency.keys
            ALTER COLUMN key_digest TYPE pg_catalog.bytea USING idempotency.key_digest(key);
    ELSIF stale OPERATOR(pg_catalog.>) 0 THEN
        UPDATE idempotency.keys
           SET key_digest = idempotency.key_digest(key)
         WHERE key_digest OPERATOR(pg_catalog.<>) idempotency.key_digest(key);
    END IF;
END
$$;

ALTER TABLE idempotency.keys ALTER COLUMN key_digest SET STATISTICS 0;

-- A role that has keys cannot be dropped ----------------------------------
--
-- A key is stored under its role's OID, and a role created after a DROP
-- ROLE may get that OID again (after OID wraparound, or pg_resetwal -o):
-- it would then read and replay the dropped role's keys. From 0.7 on, the
-- first time a role stores (or a restore loads) a key in a database, the
-- library records a shared dependency of idempotency.keys (its column
-- scope) on the role, as for the privileges a role holds: DROP ROLE then
-- fails with 2BP01 while the role has keys in any database. DROP OWNED BY,
-- in each database, deletes the role's keys there and that dependency,
-- through the event trigger below; REASSIGN OWNED leaves them. Tenant keys
-- on Citus (idempotency.tenant_keys) hold their role the same way on the
-- node that wrote them, and Citus runs DROP ROLE and DROP OWNED on every
-- node.
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

CREATE FUNCTION idempotency.mark_key_roles()
RETURNS pg_catalog.int8
AS 'MODULE_PATHNAME', 'idempotency_mark_key_roles'
LANGUAGE C VOLATILE STRICT;

COMMENT ON FUNCTION idempotency.mark_key_roles() IS
    'records that every role with keys in this database, or tenant keys on this Citus node, has them (so DROP ROLE refuses it), and deletes the keys of roles that no longer exist; returns the number of keys deleted';

REVOKE ALL ON FUNCTION idempotency.mark_key_roles() FROM PUBLIC;

-- Keys stored before this version: calls wait until the update commits
-- (a key stored meanwhile would have no mark), the roles that have keys
-- are marked, and the keys of roles dropped before the update, which no
-- role may ever reach, are deleted. Changing the table's definition makes
-- every session look its marks up again.
LOCK TABLE idempotency.keys IN SHARE ROW EXCLUSIVE MODE;
-- The same for tenant keys on Citus, on each node the update runs on (Citus
-- runs it on every node): mark_key_roles() covers the shards of this node.
DO $$
BEGIN
  IF pg_catalog.to_regclass('idempotency.tenant_keys') IS NOT NULL THEN
    LOCK TABLE idempotency.tenant_keys IN SHARE ROW EXCLUSIVE MODE;
  END IF;
END $$;
SELECT idempotency.mark_key_roles();
ALTER TABLE idempotency.keys ALTER COLUMN scope SET STATISTICS 0;
