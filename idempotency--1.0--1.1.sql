-- idempotency 1.0 -> 1.1. Every object this version adds or changes is
-- also written, as it is now, in idempotency.sql (the fresh install):
-- test/tap/308_install_matches_upgrades.pl fails when the two differ.
\echo Use "ALTER EXTENSION idempotency UPDATE TO '1.1'" to load this file. \quit

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
