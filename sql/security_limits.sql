-- What a superuser bounds and no role can exceed: how long a key lives
-- (idempotency.max_ttl) and how large a stored response is
-- (idempotency.max_response_size). TTLs that cannot work are refused when
-- set. And what no role can learn about another's keys: the table keeps no
-- planner statistics, and usage per role is for monitoring roles only.
\i sql/include/setup.sql
SET client_min_messages = warning;
CREATE EXTENSION IF NOT EXISTS idempotency;
DROP SCHEMA IF EXISTS security_limits CASCADE;
RESET client_min_messages;
CREATE SCHEMA security_limits;
SET search_path = security_limits, public;
CREATE ROLE regress_lim_alice;
CREATE ROLE regress_lim_monitor IN ROLE pg_monitor;
GRANT USAGE ON SCHEMA security_limits TO PUBLIC;
CREATE FUNCTION ttl_of(key text) RETURNS interval LANGUAGE sql AS $$
  SELECT expires_at - created_at FROM idempotency.keys WHERE keys.key = ttl_of.key
$$;
GRANT EXECUTE ON FUNCTION ttl_of(text) TO PUBLIC;

-- The defaults.
SHOW idempotency.max_ttl;
SHOW idempotency.max_response_size;

-- --- TTL ---------------------------------------------------------------------

SET SESSION AUTHORIZATION regress_lim_alice;
-- Up to the maximum is fine; the key lives that long.
SET idempotency.ttl = '30 days';
SELECT idempotency.idempotent_call('lim-30-days', NULL, 'SELECT 1');
SELECT security_limits.ttl_of('lim-30-days');
-- Beyond it is refused when set: SET, and for the role itself.
SELECT sqlstate_of($$SET idempotency.ttl = '31 days'$$);
SELECT sqlstate_of($$SET idempotency.ttl = '290000 years'$$);
SELECT sqlstate_of($$ALTER ROLE regress_lim_alice SET idempotency.ttl = '290000 years'$$);
SELECT sqlstate_of($$ALTER ROLE regress_lim_alice SET idempotency.ttl = '31 days'$$);
-- Only a superuser may move the bounds.
SELECT sqlstate_of($$SET idempotency.max_ttl = '1 year'$$);
SELECT sqlstate_of($$SET idempotency.max_response_size = '1GB'$$);
-- A TTL with a negative part is refused, even when PostgreSQL's 30-day
-- months make it positive: '-2 months 60 days 1 microsecond' ends before
-- it starts on most dates.
SELECT sqlstate_of($$SET idempotency.ttl = '-2 months 60 days 1 microsecond'$$);
SELECT sqlstate_of($$SET idempotency.ttl = '1 day -1 hour'$$);
SELECT sqlstate_of($$SET idempotency.ttl = '1 month -1 day'$$);
SELECT sqlstate_of($$SET idempotency.ttl = '0'$$);
SHOW idempotency.ttl;
RESET SESSION AUTHORIZATION;

-- The superuser is held to the same rules for ttl, on every level.
SELECT sqlstate_of($$SET idempotency.ttl = '31 days'$$);
SELECT sqlstate_of($$ALTER ROLE regress_lim_alice SET idempotency.ttl = '31 days'$$);
SELECT sqlstate_of(format($$ALTER DATABASE %I SET idempotency.ttl = '31 days'$$, current_database())) AS alter_database;
SELECT count(*) AS stored_settings FROM pg_db_role_setting
 WHERE setconfig::text LIKE '%idempotency.ttl%'
   AND (setrole = 'regress_lim_alice'::regrole
        OR setdatabase = (SELECT oid FROM pg_database WHERE datname = current_database()));
-- The maximum must be an interval that can work too.
SELECT sqlstate_of($$SET idempotency.max_ttl = '300000 years'$$);
SELECT sqlstate_of($$SET idempotency.max_ttl = '-1 day'$$);
SELECT sqlstate_of($$SET idempotency.max_ttl = '1 day -1 second'$$);
-- Raising the maximum admits a longer ttl.
SET idempotency.max_ttl = '1 year';
SET idempotency.ttl = '90 days';
SELECT idempotency.idempotent_call('lim-90-days', NULL, 'SELECT 1');
SELECT ttl_of('lim-90-days');
-- Lowering it below a ttl already in force cuts keys to the new maximum
-- (the ttl stays as set; keys never outlive max_ttl).
SET idempotency.max_ttl = '10 days';
SHOW idempotency.ttl;
SELECT idempotency.idempotent_call('lim-cut', NULL, 'SELECT 1');
SELECT ttl_of('lim-cut');
RESET idempotency.ttl;
RESET idempotency.max_ttl;
-- max_ttl holds in calendar units too: expires_at is never later than
-- created_at + max_ttl as timestamptz arithmetic computes it. '1 year', 'P1Y'
-- and '12 mons' (360 days when intervals compare) may be set under
-- '361 days', and their keys live 361 days, not 365 or 366.
SET idempotency.max_ttl = '361 days';
SET idempotency.ttl = '1 year';
SELECT idempotency.idempotent_call('lim-1-year', NULL, 'SELECT 1');
SET idempotency.ttl = 'P1Y';
SELECT idempotency.idempotent_call('lim-p1y', NULL, 'SELECT 1');
SET idempotency.ttl = '12 mons';
SELECT idempotency.idempotent_call('lim-12-mons', NULL, 'SELECT 1');
SELECT key, ttl_of(key) FROM unnest(ARRAY['lim-1-year', 'lim-p1y', 'lim-12-mons']) AS key;
RESET idempotency.ttl;
RESET idempotency.max_ttl;
-- '1 mon' under the default max_ttl ('30 days') is the calendar month from
-- the key's creation, cut to 30 days when the month is longer (31 days from
-- 3 December, 28 from 3 February).
SET idempotency.ttl = '1 mon';
SELECT idempotency.idempotent_call('lim-1-mon', NULL, 'SELECT 1');
SELECT expires_at = least(created_at + interval '1 mon', created_at + interval '30 days') AS calendar_month_at_most_30_days,
       expires_at <= created_at + interval '30 days' AS within_max_ttl
  FROM idempotency.keys WHERE key = 'lim-1-mon';
RESET idempotency.ttl;

-- --- response size -----------------------------------------------------------

CREATE TABLE runs (label text);
GRANT SELECT, INSERT ON runs TO regress_lim_alice;
SET SESSION AUTHORIZATION regress_lim_alice;
-- 11 MB is over the 10MB default: 54000, fn's effects undone, nothing
-- stored; the next call runs fn again.
SELECT sqlstate_of($$SELECT idempotency.idempotent_call('lim-11mb', NULL,
  'INSERT INTO security_limits.runs VALUES (''11mb'') RETURNING repeat(''x'', 11 * 1024 * 1024)')$$);
SELECT count(*) AS runs FROM security_limits.runs;
SELECT count(*) AS stored FROM idempotency.keys WHERE key = 'lim-11mb';
SELECT idempotency.idempotent_call('lim-11mb', NULL, 'SELECT 1'), idempotency.last_call_replayed();
-- Just under it is stored.
SELECT octet_length(idempotency.idempotent_call('lim-9mb', NULL,
  'SELECT repeat(''x'', 9 * 1024 * 1024)')::text) AS response_bytes;
-- 1 MB that does not compress, for the usage view below.
SELECT octet_length(idempotency.idempotent_call('lim-1mb', NULL,
  'SELECT string_agg(md5(g::text), '''') FROM generate_series(1, 32768) AS g')::text) AS response_bytes;
RESET SESSION AUTHORIZATION;
-- The message names the key, the size and the limit.
SET idempotency.max_response_size = '1kB';
SELECT idempotency.idempotent_call('lim-2kb', NULL, 'SELECT repeat(''x'', 2048)');
RESET idempotency.max_response_size;
-- complete() is held to the same limit: nothing is stored.
SET SESSION AUTHORIZATION regress_lim_alice;
BEGIN;
SELECT replayed FROM idempotency.claim('lim-complete-11mb', NULL);
SELECT sqlstate_of($$SELECT idempotency.complete('lim-complete-11mb',
  jsonb_build_object('pad', repeat('x', 11 * 1024 * 1024)))$$);
SELECT idempotency.release('lim-complete-11mb');
COMMIT;
RESET SESSION AUTHORIZATION;
SELECT count(*) AS stored FROM idempotency.keys WHERE key = 'lim-complete-11mb';

-- --- statistics and usage ------------------------------------------------------

-- No column of idempotency.keys gathers statistics, so ANALYZE leaves
-- nothing for the planner to tell one role about another's keys.
SELECT count(*) AS columns_with_statistics FROM pg_attribute
 WHERE attrelid = 'idempotency.keys'::regclass AND attnum > 0
   AND NOT attisdropped AND attstattarget <> 0;
ANALYZE idempotency.keys;
SELECT count(*) AS statistics_rows FROM pg_statistic
 WHERE starelid = 'idempotency.keys'::regclass;
-- idempotency.stats still plans and counts.
SELECT keys >= 3 AS stats_count_keys FROM idempotency.stats
 WHERE datname = current_database();

-- Keys and bytes per role, for monitoring roles only.
SELECT role, keys, bytes > 1024 * 1024 AS over_1mb
  FROM idempotency.key_usage WHERE role = 'regress_lim_alice'::regrole;
SELECT attname FROM pg_attribute
 WHERE attrelid = 'idempotency.key_usage'::regclass AND attnum > 0 ORDER BY attnum;
SET SESSION AUTHORIZATION regress_lim_alice;
SELECT sqlstate_of($$SELECT * FROM idempotency.key_usage$$);
RESET SESSION AUTHORIZATION;
SET SESSION AUTHORIZATION regress_lim_monitor;
SELECT keys FROM idempotency.key_usage WHERE role = 'regress_lim_alice'::regrole;
RESET SESSION AUTHORIZATION;

DELETE FROM idempotency.keys WHERE key LIKE 'lim-%';
SET client_min_messages = warning;
DROP SCHEMA security_limits CASCADE;
RESET client_min_messages;
-- A role that has keys is dropped after DROP OWNED BY, which deletes them.
DROP OWNED BY regress_lim_alice;
DROP ROLE regress_lim_alice;
DROP ROLE regress_lim_monitor;
RESET search_path;
