-- idempotency 1.0 -> 1.1. Every object this version adds or changes is
-- also written, as it is now, in idempotency.sql (the fresh install):
-- test/tap/308_install_matches_upgrades.pl fails when the two differ.
\echo Use "ALTER EXTENSION idempotency UPDATE TO '1.1'" to load this file. \quit

-- The expiry index's order: estimators, a merge-joinable equality, LEAKPROOF
-- copies ---------------------------------------------------------------------
--
-- The B-tree family of keys_expires_at_idx, as catalog checks such as
-- PostgreSQL's opr_sanity expect it: each operator with timestamptz's
-- estimators, the equality merge-joinable and its own commutator, and the
-- functions, copies of the server's timestamp_* kept for their revoked
-- rights, LEAKPROOF as those are (idempotency.sql says why they exist).
ALTER FUNCTION idempotency.expiry_lt(pg_catalog.timestamptz, pg_catalog.timestamptz) LEAKPROOF;
ALTER FUNCTION idempotency.expiry_le(pg_catalog.timestamptz, pg_catalog.timestamptz) LEAKPROOF;
ALTER FUNCTION idempotency.expiry_eq(pg_catalog.timestamptz, pg_catalog.timestamptz) LEAKPROOF;
ALTER FUNCTION idempotency.expiry_ge(pg_catalog.timestamptz, pg_catalog.timestamptz) LEAKPROOF;
ALTER FUNCTION idempotency.expiry_gt(pg_catalog.timestamptz, pg_catalog.timestamptz) LEAKPROOF;
ALTER FUNCTION idempotency.expiry_cmp(pg_catalog.timestamptz, pg_catalog.timestamptz) LEAKPROOF;

ALTER OPERATOR idempotency.~<~ (pg_catalog.timestamptz, pg_catalog.timestamptz)
    SET (RESTRICT = pg_catalog.scalarltsel, JOIN = pg_catalog.scalarltjoinsel);
ALTER OPERATOR idempotency.~<=~ (pg_catalog.timestamptz, pg_catalog.timestamptz)
    SET (RESTRICT = pg_catalog.scalarlesel, JOIN = pg_catalog.scalarlejoinsel);
ALTER OPERATOR idempotency.~=~ (pg_catalog.timestamptz, pg_catalog.timestamptz)
    SET (RESTRICT = pg_catalog.eqsel, JOIN = pg_catalog.eqjoinsel);
ALTER OPERATOR idempotency.~>=~ (pg_catalog.timestamptz, pg_catalog.timestamptz)
    SET (RESTRICT = pg_catalog.scalargesel, JOIN = pg_catalog.scalargejoinsel);
ALTER OPERATOR idempotency.~>~ (pg_catalog.timestamptz, pg_catalog.timestamptz)
    SET (RESTRICT = pg_catalog.scalargtsel, JOIN = pg_catalog.scalargtjoinsel);

-- ALTER OPERATOR sets COMMUTATOR and MERGES from PostgreSQL 17 on. Before
-- 17 the two columns are written as CREATE OPERATOR ... COMMUTATOR, MERGES
-- writes them for a fresh install (neither records a dependency): making
-- the operator again would drop its operator class, hence
-- keys_expires_at_idx, and rebuild the index over every key under an
-- exclusive lock. EXECUTE: before 17 the statement does not even parse.
DO $$
BEGIN
  IF pg_catalog.current_setting('server_version_num')::pg_catalog.int4 OPERATOR(pg_catalog.>=) 170000 THEN
    EXECUTE 'ALTER OPERATOR idempotency.~=~ (pg_catalog.timestamptz, pg_catalog.timestamptz)
                 SET (COMMUTATOR = OPERATOR(idempotency.~=~), MERGES)';
  ELSE
    UPDATE pg_catalog.pg_operator
       SET oprcom = oid, oprcanmerge = true
     WHERE oid OPERATOR(pg_catalog.=)
           'idempotency.~=~(pg_catalog.timestamptz,pg_catalog.timestamptz)'::pg_catalog.regoperator;
  END IF;
END
$$;

-- Expiry status: the expired rows a round kept because a DBA's constraint,
-- index or trigger refused their tombstones (and the first refusal), and
-- the rounds that gave way to a lock or statement timeout. The function's
-- result gains columns, so it and its view are made again.
DROP VIEW idempotency.expiry_status;
DROP FUNCTION idempotency.expiry_status();

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

REVOKE ALL ON FUNCTION idempotency.expiry_status() FROM PUBLIC;
REVOKE ALL ON idempotency.expiry_status FROM PUBLIC;
GRANT EXECUTE ON FUNCTION idempotency.expiry_status() TO pg_monitor;
GRANT SELECT ON idempotency.expiry_status TO pg_monitor;

-- Tombstones and a DBA's changes of idempotency.keys: NOT NULL on response
-- and unique indexes over the key text that would refuse tombstones are
-- refused when they are made. The event trigger and its function, as in
-- idempotency.sql:
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

-- One rule for a key's windows: how long a key is remembered after its TTL
-- is fixed when it is claimed, as its TTL is, and stored with it as exact
-- time (remember_for), so that a caller judging an expired row and expiry
-- writing its tombstone end the window at the same instant whatever their
-- own idempotency.remember (a role's or a database's). NULL stands for 7
-- days, the setting's default, so that keys under it cost nothing more. A
-- nullable column without a default: added without rewriting the table.
-- Live keys written before get the window the updating session's
-- idempotency.remember gives (months as 30 days, days as 24 hours): no
-- write at all under the default.
ALTER TABLE idempotency.keys ADD COLUMN remember_for pg_catalog.interval;
ALTER TABLE idempotency.keys ALTER COLUMN remember_for SET STATISTICS 0;
COMMENT ON COLUMN idempotency.keys.remember_for IS
    'how long after expires_at a live key is remembered as a tombstone (idempotency.remember when it was claimed, as exact time); NULL: 7 days';

DO $$
DECLARE
  span pg_catalog.interval := pg_catalog.make_interval(secs =>
    pg_catalog.date_part('epoch', COALESCE(
      NULLIF(pg_catalog.current_setting('idempotency.remember', true), ''),
      '7 days')::pg_catalog.interval));
  on_coordinator pg_catalog.bool := false;
BEGIN
  IF pg_catalog.to_regclass('idempotency.tenant_keys') IS NOT NULL THEN
    -- On the coordinator only: Citus adds the column on the workers.
    on_coordinator := (SELECT g.groupid FROM pg_catalog.pg_dist_local_group AS g)
                      OPERATOR(pg_catalog.=) 0;
    IF on_coordinator THEN
      ALTER TABLE idempotency.tenant_keys ADD COLUMN remember_for pg_catalog.interval;
    END IF;
  END IF;
  IF span OPERATOR(pg_catalog.=) '7 days'::pg_catalog.interval THEN
    RETURN;
  END IF;
  UPDATE idempotency.keys AS k SET remember_for = span
   WHERE k.expired_at IS NULL;
  IF on_coordinator THEN
    UPDATE idempotency.tenant_keys AS k SET remember_for = span
     WHERE k.expired_at IS NULL;
  END IF;
END $$;

-- distribute_keys() creates the column too.
CREATE OR REPLACE FUNCTION idempotency.distribute_keys(colocate_with pg_catalog.regclass)
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
