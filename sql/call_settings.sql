-- Session state and settings: last_call_replayed() before any call, the
-- TTL written as an ISO 8601 duration, and idempotency.ttl and
-- idempotency.wait_timeout set per role and per database.
-- Each pg_regress file runs in a new session: no call has happened yet.
SELECT idempotency.last_call_replayed() IS NULL AS null_before_any_call;
SET client_min_messages = warning;
CREATE EXTENSION IF NOT EXISTS idempotency;
RESET client_min_messages;
CREATE ROLE regress_settings_clerk LOGIN;
SELECT current_user AS superuser \gset

-- A key's expires_at is its TTL after the moment it was stored: between
-- the transaction's start plus the TTL and the current clock plus the TTL.

-- 'P1D' is one day.
BEGIN;
SET LOCAL idempotency.ttl = 'P1D';
SHOW idempotency.ttl;
SELECT idempotency.idempotent_call('set-iso', NULL, 'SELECT 1');
SELECT expires_at BETWEEN now() + interval '1 day' AND clock_timestamp() + interval '1 day' AS lives_one_day
  FROM idempotency.keys WHERE key = 'set-iso';
COMMIT;

-- Per role: a new session of the role gets the role's settings.
ALTER ROLE regress_settings_clerk SET idempotency.ttl = '7 days';
ALTER ROLE regress_settings_clerk SET idempotency.wait_timeout = '2s';
\c - regress_settings_clerk
SHOW idempotency.ttl;
SHOW idempotency.wait_timeout;
BEGIN;
SELECT idempotency.idempotent_call('set-role', NULL, 'SELECT 1');
SELECT expires_at BETWEEN now() + interval '7 days' AND clock_timestamp() + interval '7 days' AS lives_a_week
  FROM idempotency.keys WHERE key = 'set-role';
COMMIT;
\c - :"superuser"
ALTER ROLE regress_settings_clerk RESET ALL;

-- Per database: a new session in the database gets its settings.
SELECT current_database() AS db \gset
ALTER DATABASE :"db" SET idempotency.ttl = '2 hours';
ALTER DATABASE :"db" SET idempotency.wait_timeout = '3s';
\c
SHOW idempotency.ttl;
SHOW idempotency.wait_timeout;
BEGIN;
SELECT idempotency.idempotent_call('set-database', NULL, 'SELECT 1');
SELECT expires_at BETWEEN now() + interval '2 hours' AND clock_timestamp() + interval '2 hours' AS lives_two_hours
  FROM idempotency.keys WHERE key = 'set-database';
COMMIT;
ALTER DATABASE :"db" RESET idempotency.ttl;
ALTER DATABASE :"db" RESET idempotency.wait_timeout;

DELETE FROM idempotency.keys WHERE key LIKE 'set-%';
-- A role that has keys is dropped after DROP OWNED BY, which deletes them.
DROP OWNED BY regress_settings_clerk;
DROP ROLE regress_settings_clerk;
