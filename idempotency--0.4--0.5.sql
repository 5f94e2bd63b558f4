-- idempotency 0.4 -> 0.5: keys distributed with the tenants' data on Citus.
-- Nothing here changes idempotency.keys: its rows stay as they are.
\echo Use "ALTER EXTENSION idempotency UPDATE TO '0.5'" to load this file. \quit

-- Tenant keys ---------------------------------------------------------------
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

-- Statistics count tenant keys too ------------------------------------------
--
-- The number of tenant keys and the oldest one's creation, read through
-- Citus (every shard) as the table's owner; zero and NULL without the
-- table. For the stats view only.
CREATE FUNCTION idempotency.tenant_key_totals(OUT keys pg_catalog.int8,
                                              OUT oldest pg_catalog.timestamptz)
LANGUAGE plpgsql SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
  keys := 0;
  IF pg_catalog.to_regclass('idempotency.tenant_keys') IS NOT NULL THEN
    SELECT pg_catalog.count(*), pg_catalog.min(k.created_at) INTO keys, oldest
      FROM idempotency.tenant_keys AS k;
  END IF;
END $$;

REVOKE ALL ON FUNCTION idempotency.tenant_key_totals() FROM PUBLIC;
GRANT EXECUTE ON FUNCTION idempotency.tenant_key_totals() TO pg_monitor;

CREATE OR REPLACE VIEW idempotency.stats AS
    WITH tenant AS (SELECT * FROM idempotency.tenant_key_totals()),
    here AS (
        SELECT d.oid AS datid,
               (SELECT pg_catalog.count(*) FROM idempotency.keys)
                 OPERATOR(pg_catalog.+) (SELECT t.keys FROM tenant AS t) AS keys,
               pg_catalog.now() OPERATOR(pg_catalog.-)
                   (SELECT pg_catalog.min(o.created_at) FROM (
                      SELECT k.created_at FROM idempotency.keys AS k
                      UNION ALL SELECT t.oldest FROM tenant AS t) AS o) AS oldest_key_age
          FROM pg_catalog.pg_database AS d
         WHERE d.datname OPERATOR(pg_catalog.=) pg_catalog.current_database())
    SELECT coalesce(c.datid, h.datid) AS datid,
           db.datname,
           c.calls_ran, c.replays, c.conflicts, c.mismatches, c.keys_expired,
           h.keys, h.oldest_key_age, c.stats_reset
      FROM idempotency.stats_counters() AS c
      FULL JOIN here AS h ON h.datid OPERATOR(pg_catalog.=) c.datid
      LEFT JOIN pg_catalog.pg_database AS db
        ON db.oid OPERATOR(pg_catalog.=) coalesce(c.datid, h.datid);
