-- Every outcome of one call that a single session can show.
CREATE TABLE counters (name text PRIMARY KEY, n int NOT NULL);
INSERT INTO counters VALUES ('runs', 0);
CREATE FUNCTION bump() RETURNS int LANGUAGE sql AS
  $$ UPDATE counters SET n = n + 1 WHERE name = 'runs' RETURNING n $$;
CREATE FUNCTION fail(message text) RETURNS int LANGUAGE plpgsql AS $$
BEGIN
  PERFORM bump();
  RAISE EXCEPTION '%', message USING ERRCODE = 'P0001';
END $$;

-- fn raises: the error arrives unchanged (SQLSTATE, message), nothing is
-- stored, fn's effects are gone, and a retry runs fn again.
SELECT sqlstate_of($$SELECT idempotency.idempotent_call('k-fail', NULL, 'SELECT fail($1)', 'card declined')$$);
SELECT sqlstate_of($$SELECT idempotency.idempotent_call('k-fail', NULL, 'SELECT 1/0')$$);
SELECT count(*) AS stored FROM idempotency.keys WHERE key = 'k-fail';
SELECT n AS runs FROM counters;
\set VERBOSITY terse
SELECT idempotency.idempotent_call('k-fail', NULL, 'SELECT fail($1)', 'card declined');
\set VERBOSITY default
SELECT idempotency.idempotent_call('k-fail', NULL, 'SELECT bump()');
SELECT n AS runs FROM counters;

-- Bad arguments: 22004 for NULL key or fn, 22023 for an empty key or one over
-- 255 bytes (a 1 MB key is refused by its size); nothing is stored.
SELECT sqlstate_of($$SELECT idempotency.idempotent_call(NULL, NULL, 'SELECT 1')$$);
SELECT sqlstate_of($$SELECT idempotency.idempotent_call('k', NULL, NULL)$$);
SELECT sqlstate_of($$SELECT idempotency.idempotent_call(NULL, NULL, NULL, 1)$$);
SELECT sqlstate_of($$SELECT idempotency.idempotent_call('', NULL, 'SELECT 1')$$);
SELECT sqlstate_of($$SELECT idempotency.idempotent_call(repeat('x', 256), NULL, 'SELECT 1')$$);
SELECT sqlstate_of($$SELECT idempotency.idempotent_call(repeat('é', 128), NULL, 'SELECT 1')$$);
SELECT sqlstate_of($$SELECT idempotency.idempotent_call(repeat('x', 1000000), NULL, 'SELECT 1')$$);
SELECT idempotency.idempotent_call(repeat('x', 255), NULL, 'SELECT 255');
SELECT count(*) AS stored, max(octet_length(key)) AS longest FROM idempotency.keys WHERE key LIKE 'xxx%';

-- fn must be exactly one statement and cannot end the transaction.
SELECT sqlstate_of($$SELECT idempotency.idempotent_call('k-two', NULL, 'SELECT bump(); SELECT bump()')$$);
SELECT sqlstate_of($$SELECT idempotency.idempotent_call('k-two', NULL, '')$$);
SELECT sqlstate_of($$SELECT idempotency.idempotent_call('k-two', NULL, 'SELEC 1')$$);
SELECT sqlstate_of($$SELECT idempotency.idempotent_call('k-two', NULL, 'COMMIT')$$);
SELECT n AS runs FROM counters;

-- The same key inside its own fn is a clear error (IK508), never a hang;
-- another key inside fn is an ordinary nested call.
SELECT sqlstate_of($$SELECT idempotency.idempotent_call('k-self', NULL, 'SELECT idempotency.idempotent_call(''k-self'', NULL, ''SELECT bump()'')')$$);
SELECT count(*) AS stored FROM idempotency.keys WHERE key = 'k-self';
SELECT idempotency.idempotent_call('k-outer', NULL, 'SELECT idempotency.idempotent_call(''k-inner'', NULL, ''SELECT bump()'')');
SELECT key, response FROM idempotency.keys WHERE key IN ('k-outer', 'k-inner') ORDER BY key;

-- The key commits or rolls back with the caller's transaction...
BEGIN;
SELECT idempotency.idempotent_call('k-rollback', NULL, 'SELECT bump()');
ROLLBACK;
SELECT count(*) AS stored FROM idempotency.keys WHERE key = 'k-rollback';
-- ... and with an enclosing savepoint.
BEGIN;
SAVEPOINT s;
SELECT idempotency.idempotent_call('k-savepoint', NULL, 'SELECT bump()');
ROLLBACK TO SAVEPOINT s;
SELECT idempotency.idempotent_call('k-savepoint', NULL, 'SELECT bump()'), idempotency.last_call_replayed();
COMMIT;
SELECT key, response FROM idempotency.keys WHERE key = 'k-savepoint';

-- Within one transaction a repeated key replays (and a different request
-- is still IK422).
BEGIN;
SELECT idempotency.idempotent_call('k-same-tx', NULL, 'SELECT bump()');
SELECT idempotency.idempotent_call('k-same-tx', NULL, 'SELECT bump()'), idempotency.last_call_replayed();
SELECT sqlstate_of($$SELECT idempotency.idempotent_call('k-same-tx', NULL, 'SELECT bump() + 0')$$);
COMMIT;
-- In one statement, the first row runs fn and the others replay.
SELECT idempotency.idempotent_call('k-srf', NULL, 'SELECT bump()') FROM generate_series(1, 3);

-- last_call_replayed is NULL after a call that failed.
SELECT sqlstate_of($$SELECT idempotency.idempotent_call('', NULL, 'SELECT 1')$$);
SELECT idempotency.last_call_replayed();

-- A read-only transaction may replay but not run fn (25006).
BEGIN READ ONLY;
SELECT idempotency.idempotent_call('k-srf', NULL, 'SELECT bump()');
SELECT sqlstate_of($$SELECT idempotency.idempotent_call('k-new-ro', NULL, 'SELECT bump()')$$);
COMMIT;

-- 10,000 calls with distinct keys in one transaction: claims do not pile
-- up in the lock table (max_locks_per_transaction is 64 by default).
SHOW max_locks_per_transaction;
BEGIN;
SELECT count(idempotency.idempotent_call('inbox-batch-' || i, NULL, 'SELECT $1 * 2', i)) AS calls
  FROM generate_series(1, 10000) AS i;
SELECT count(*) AS locks_held FROM pg_locks WHERE pid = pg_backend_pid() AND locktype = 'advisory';
COMMIT;
SELECT count(*) AS batch_keys, sum((response)::int) AS sum_of_responses
  FROM idempotency.keys WHERE key LIKE 'inbox-batch-%';

-- Rows are written as INSERT writes them, to every index of the table,
-- expression indexes too.
CREATE INDEX keys_lower_key ON idempotency.keys (lower(key));
SELECT sqlstate_of($$SELECT idempotency.idempotent_call('k-expression-index', NULL, 'SELECT bump()')$$);
DROP INDEX idempotency.keys_lower_key;
SELECT count(*) AS stored FROM idempotency.keys WHERE key = 'k-expression-index';
CREATE INDEX keys_created_at ON idempotency.keys (created_at);
SELECT idempotency.idempotent_call('k-extra-index', NULL, 'SELECT 1');
-- The extra index got the new row's entry: a scan of it finds every key.
SET enable_seqscan = off;
SET enable_bitmapscan = off;
EXPLAIN (COSTS OFF) SELECT count(*) FROM idempotency.keys WHERE created_at > '-infinity';
SELECT count(*) AS through_index FROM idempotency.keys WHERE created_at > '-infinity';
RESET enable_seqscan;
RESET enable_bitmapscan;
SET enable_indexscan = off;
SET enable_bitmapscan = off;
SELECT count(*) AS through_heap FROM idempotency.keys WHERE created_at > '-infinity';
RESET enable_indexscan;
RESET enable_bitmapscan;
DROP INDEX idempotency.keys_created_at;
