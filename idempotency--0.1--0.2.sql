-- idempotency 0.1 -> 0.2: call statistics.
\echo Use "ALTER EXTENSION idempotency UPDATE TO '0.2'" to load this file. \quit

-- Counters per database, from shared memory (needs the library preloaded;
-- no rows otherwise).
CREATE FUNCTION idempotency.stats_counters(
    OUT datid pg_catalog.oid,
    OUT calls_ran pg_catalog.int8,
    OUT replays pg_catalog.int8,
    OUT conflicts pg_catalog.int8,
    OUT mismatches pg_catalog.int8,
    OUT keys_expired pg_catalog.int8,
    OUT stats_reset pg_catalog.timestamptz)
RETURNS SETOF record
AS 'MODULE_PATHNAME', 'idempotency_stats_counters'
LANGUAGE C VOLATILE PARALLEL RESTRICTED;

-- Zeroes this database's counters.
CREATE FUNCTION idempotency.stats_reset()
RETURNS pg_catalog.void
AS 'MODULE_PATHNAME', 'idempotency_stats_reset'
LANGUAGE C VOLATILE PARALLEL RESTRICTED;

-- One row per database with counters, and always one for this database.
-- keys and oldest_key_age are this database's (other databases' tables are
-- out of reach) and read the whole table: a scan, not a lookup. The view
-- runs with its owner's rights, so it counts every role's keys while
-- showing no key or response.
CREATE VIEW idempotency.stats AS
    WITH here AS (
        SELECT d.oid AS datid,
               (SELECT pg_catalog.count(*) FROM idempotency.keys) AS keys,
               pg_catalog.now() OPERATOR(pg_catalog.-)
                   (SELECT pg_catalog.min(k.created_at) FROM idempotency.keys AS k) AS oldest_key_age
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

COMMENT ON VIEW idempotency.stats IS
    'idempotent_call outcomes per database (calls that ran fn, replays, IK409, IK422), keys deleted by expiry, and this database''s key count and oldest key age';

-- Monitoring roles may read the statistics; only superusers reset them.
REVOKE ALL ON FUNCTION idempotency.stats_counters() FROM PUBLIC;
REVOKE ALL ON FUNCTION idempotency.stats_reset() FROM PUBLIC;
REVOKE ALL ON idempotency.stats FROM PUBLIC;
GRANT EXECUTE ON FUNCTION idempotency.stats_counters() TO pg_monitor;
GRANT SELECT ON idempotency.stats TO pg_monitor;
