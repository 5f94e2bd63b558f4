-- Key expiry: a key's TTL is the idempotency.ttl in force when it was
-- claimed; past it the key is absent for idempotent_call (fn runs again)
-- whether or not it has been deleted yet; idempotency.expire() deletes the
-- expired keys now and is only for privileged roles.
\i sql/include/setup.sql
-- Keys past their TTL without tombstones (idempotency.remember = 0);
-- tombstones.sql tests them with.
SET idempotency.remember = 0;
-- Keys other tests left expired are not this test's business.
SELECT idempotency.expire() AS expired_before \gset

-- fn's result is the run number: a replay answers an old number, a run a
-- new one.
CREATE SEQUENCE expiry_runs;
CREATE FUNCTION run(key text, OUT response jsonb, OUT replayed boolean)
LANGUAGE plpgsql AS $$
BEGIN
  response := idempotency.idempotent_call(key, NULL, 'SELECT nextval(''expiry_runs'')');
  replayed := idempotency.last_call_replayed();
END $$;
CREATE FUNCTION ttl_of(key text) RETURNS interval LANGUAGE sql AS $$
  SELECT expires_at - created_at FROM idempotency.keys WHERE keys.key = ttl_of.key
$$;
-- Moves the keys' lifetime into the past, TTL unchanged: they are expired
-- now. (A transaction cannot commit a key that has already expired.)
CREATE FUNCTION age_keys(VARIADIC aged text[]) RETURNS void LANGUAGE sql AS $$
  UPDATE idempotency.keys
     SET created_at = created_at - (expires_at - now()) - interval '1 second',
         expires_at = now() - interval '1 second'
   WHERE key = ANY (aged)
$$;

-- The default TTL, and a per-key TTL with SET LOCAL that ends with the
-- transaction.
SHOW idempotency.ttl;
SELECT * FROM run('daily');
BEGIN;
SET LOCAL idempotency.ttl = '7 days';
SELECT * FROM run('refund');
COMMIT;
SHOW idempotency.ttl;
SELECT * FROM run('after-refund');
SELECT key, ttl_of(key) FROM idempotency.keys
 WHERE key IN ('daily', 'refund', 'after-refund') ORDER BY key;
-- A replay keeps the key's own TTL, whatever the TTL in force now.
SET idempotency.ttl = '1 hour';
SELECT * FROM run('refund');
SELECT ttl_of('refund');
RESET idempotency.ttl;

-- Bad TTLs are refused.
SET idempotency.ttl = '0';
SET idempotency.ttl = '-1 day';
SET idempotency.ttl = 'soon';

-- A key past its TTL runs fn again, although its row is still there; the
-- new run gets the TTL in force now.
BEGIN;
SET LOCAL idempotency.ttl = '1 hour';
SELECT * FROM run('brief');
COMMIT;
SELECT age_keys('brief');
SELECT count(*) AS rows_still_stored FROM idempotency.keys WHERE key = 'brief';
SELECT * FROM run('brief');
SELECT * FROM run('brief');
SELECT ttl_of('brief');

-- expire() deletes the expired keys of every role, and only those.
CREATE ROLE regress_expiry_user;
GRANT EXECUTE ON FUNCTION run(text) TO regress_expiry_user;
GRANT USAGE ON SEQUENCE expiry_runs TO regress_expiry_user;
BEGIN;
SELECT * FROM run('old-1');
SELECT * FROM run('old-2');
SET LOCAL ROLE regress_expiry_user;
SELECT * FROM run('old-of-another-role');
COMMIT;
SELECT age_keys('old-1', 'old-2', 'old-of-another-role');
SELECT idempotency.expire();
SELECT key FROM idempotency.keys
 WHERE key IN ('daily', 'refund', 'after-refund', 'brief', 'old-1', 'old-2', 'old-of-another-role')
 ORDER BY key;
SELECT idempotency.expire();
-- A deleted key runs fn again.
SELECT * FROM run('old-1');

-- expire() runs in the caller's transaction: rolled back, the keys stay.
SELECT * FROM run('kept-by-rollback');
SELECT age_keys('kept-by-rollback');
BEGIN;
SELECT idempotency.expire();
ROLLBACK;
SELECT count(*) FROM idempotency.keys WHERE key = 'kept-by-rollback';
-- It writes: not in a read-only transaction.
BEGIN READ ONLY;
SELECT idempotency.expire();
ROLLBACK;
SELECT idempotency.expire();

-- Who may run expire(): superusers, and roles granted EXECUTE on it. The
-- worker's status is for pg_monitor.
\set VERBOSITY terse
SET ROLE regress_expiry_user;
SELECT idempotency.expire();
SELECT count(*) FROM idempotency.expiry_status;
RESET ROLE;
GRANT EXECUTE ON FUNCTION idempotency.expire() TO regress_expiry_user;
GRANT pg_monitor TO regress_expiry_user;
SET ROLE regress_expiry_user;
SELECT idempotency.expire();
SELECT count(*) >= 0 AS may_read_status FROM idempotency.expiry_status;
RESET ROLE;
\set VERBOSITY default

-- The expiry settings and their defaults (this suite's server turns the
-- worker off with expire_interval = 0).
SELECT name, boot_val, unit, context FROM pg_settings
 WHERE name LIKE 'idempotency.expire%' ORDER BY name;
SET idempotency.expire_interval = '1s';
SET idempotency.expire_batch_size = 0;
SET idempotency.expire_rate = -1;
-- expire_rate replaced expire_batch_delay in 0.4.
SET idempotency.expire_batch_delay = 5;
-- A smaller batch changes nothing but the number of passes.
SET idempotency.expire_batch_size = 1;
SELECT r.* FROM generate_series(1, 3) AS g, run('batch-' || g) AS r;
SELECT age_keys('batch-1', 'batch-2', 'batch-3');
SELECT idempotency.expire();
RESET idempotency.expire_batch_size;

REVOKE EXECUTE ON FUNCTION idempotency.expire() FROM regress_expiry_user;
REVOKE pg_monitor FROM regress_expiry_user;
DROP FUNCTION run(text);
DROP FUNCTION ttl_of(text);
DROP FUNCTION age_keys(text[]);
DROP SEQUENCE expiry_runs;
SELECT idempotency.expire() AS expired_after \gset
-- A role that has keys is dropped after DROP OWNED BY, which deletes them.
DROP OWNED BY regress_expiry_user;
DROP ROLE regress_expiry_user;
