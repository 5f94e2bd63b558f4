-- idempotency 0.7 -> 1.0. Every object this version adds or changes is
-- also written, as it is now, in idempotency.sql (the fresh install):
-- test/tap/308_install_matches_upgrades.pl fails when the two differ.
\echo Use "ALTER EXTENSION idempotency UPDATE TO '1.0'" to load this file. \quit

-- Dumps of versions before 0.4 no longer load (their request_hash is text,
-- not a fingerprint); status stays for the dumps of 0.7 and 1.0.
COMMENT ON COLUMN idempotency.keys.status IS
    'always NULL: accepts the status column that dumps of 0.7 and 1.0 name';
COMMENT ON FUNCTION idempotency.keys_loaded() IS
    'fills key_digest for rows loaded into idempotency.keys by COPY or INSERT';

-- Tombstones: when a key's response expires, expiry replaces its row with
-- one (key empty, response NULL, expired_at set, expires_at when it goes);
-- a retry of its request gets IK410 until then. A nullable column without
-- a default: added without rewriting the table.
ALTER TABLE idempotency.keys ADD COLUMN expired_at pg_catalog.timestamptz;
ALTER TABLE idempotency.keys ALTER COLUMN expired_at SET STATISTICS 0;
COMMENT ON COLUMN idempotency.keys.expired_at IS
    'NULL for a live key; for a tombstone (response NULL, key empty), when its response expired: until expires_at a retry of its request gets IK410';
COMMENT ON FUNCTION idempotency.expire() IS
    'deletes the keys of this database that are past their TTL (each replaced by its tombstone while idempotency.remember keeps it) and the tombstones past that, in the caller''s transaction; returns how many rows it deleted';

-- Tenant keys keep tombstones too: distribute_keys() creates the column,
-- and an existing idempotency.tenant_keys gets it.
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
    '  PRIMARY KEY (tenant, scope, key_digest))', tenant_type);
  CREATE INDEX tenant_keys_expires_at_idx ON idempotency.tenant_keys (expires_at);
  COMMENT ON TABLE idempotency.tenant_keys IS
    'idempotency keys distributed with the tenants'' data; written only through the idempotency.tenant_* functions';
  REVOKE ALL ON TABLE idempotency.tenant_keys FROM PUBLIC;
  PERFORM pg_catalog.create_distributed_table('idempotency.tenant_keys', 'tenant',
                                              colocate_with => colocate_with::pg_catalog.text);
  RETURN 'idempotency.tenant_keys'::pg_catalog.regclass;
END $$;

DO $$
BEGIN
  IF pg_catalog.to_regclass('idempotency.tenant_keys') IS NULL THEN
    RETURN;
  END IF;
  -- On the coordinator only: Citus adds the column on the workers (the
  -- table exists only with Citus, so its catalog does too).
  IF (SELECT g.groupid FROM pg_catalog.pg_dist_local_group AS g)
     OPERATOR(pg_catalog.=) 0 THEN
    ALTER TABLE idempotency.tenant_keys ADD COLUMN expired_at pg_catalog.timestamptz;
  END IF;
END $$;

-- A role that has keys cannot be dropped -------------------------------------
--
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

-- Marks a GRANT or REVOKE took before this version are recorded again (as
-- the expiry worker's rounds would), and the keys of roles dropped
-- meanwhile, which no role may ever reach, are deleted.
SELECT idempotency.mark_key_roles();

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
-- or over 255 bytes.
CREATE FUNCTION idempotency.derived_key(key pg_catalog.text, label pg_catalog.text)
RETURNS pg_catalog.text
AS 'MODULE_PATHNAME', 'idempotency_derived_key'
LANGUAGE C STABLE CALLED ON NULL INPUT PARALLEL SAFE SECURITY INVOKER;

COMMENT ON FUNCTION idempotency.derived_key(pg_catalog.text, pg_catalog.text) IS
    'the key for a call made outside the database while handling key: the same for the same role, key and label on every retry; a UUID (version 8) no other role can compute';

-- The application API: many keys in one statement ---------------------------------

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

-- Statistics: IK410 answers counted (late_retries); keys and oldest_key_age
-- count live keys only, tombstones apart. A function's OUT columns change
-- only by dropping it, and the view with it.
DROP VIEW idempotency.stats;
DROP FUNCTION idempotency.stats_counters();
DROP FUNCTION idempotency.tenant_key_totals();

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
CREATE OR REPLACE VIEW idempotency.key_usage AS
    SELECT k.scope::pg_catalog.regrole AS role,
           pg_catalog.count(*) FILTER (WHERE k.expired_at IS NULL) AS keys,
           pg_catalog.sum(pg_catalog.pg_column_size(k.*))::pg_catalog.int8 AS bytes,
           pg_catalog.count(*) FILTER (WHERE k.expired_at IS NOT NULL) AS tombstones
      FROM idempotency.keys AS k
     GROUP BY k.scope;

COMMENT ON VIEW idempotency.key_usage IS
    'live keys, bytes of all rows and tombstones per role in this database, without keys or responses';

REVOKE ALL ON FUNCTION idempotency.stats_counters() FROM PUBLIC;
REVOKE ALL ON FUNCTION idempotency.tenant_key_totals() FROM PUBLIC;
REVOKE ALL ON idempotency.stats FROM PUBLIC;
GRANT EXECUTE ON FUNCTION idempotency.stats_counters() TO pg_monitor;
GRANT EXECUTE ON FUNCTION idempotency.tenant_key_totals() TO pg_monitor;
GRANT SELECT ON idempotency.stats TO pg_monitor;
