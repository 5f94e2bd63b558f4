-- Every outcome of one call that a single session can show.
\i sql/include/setup.sql
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

-- Every field of fn's error reaches the caller unchanged: SQLSTATE,
-- message, DETAIL, HINT, and the table, column and constraint of a
-- constraint violation.
CREATE TABLE strict_values (v int CONSTRAINT v_positive CHECK (v > 0));
CREATE FUNCTION fail_in_detail() RETURNS int LANGUAGE plpgsql AS $$
BEGIN
  RAISE EXCEPTION 'card declined' USING ERRCODE = 'P0002', DETAIL = 'issuer said no', HINT = 'use another card';
END $$;
CREATE FUNCTION error_fields(sql text) RETURNS TABLE (field text, value text) LANGUAGE plpgsql AS $$
DECLARE
  state text; message text; detail text; hint text; tab text; col text; cons text;
BEGIN
  EXECUTE sql;
  RETURN QUERY SELECT 'error', 'none';
EXCEPTION WHEN OTHERS THEN
  GET STACKED DIAGNOSTICS state = RETURNED_SQLSTATE, message = MESSAGE_TEXT,
    detail = PG_EXCEPTION_DETAIL, hint = PG_EXCEPTION_HINT, tab = TABLE_NAME,
    col = COLUMN_NAME, cons = CONSTRAINT_NAME;
  RETURN QUERY VALUES ('sqlstate', state), ('message', message), ('detail', detail),
    ('hint', hint), ('table', tab), ('column', col), ('constraint', cons);
END $$;
SELECT * FROM error_fields($$SELECT idempotency.idempotent_call('k-detail', NULL, 'SELECT fail_in_detail()')$$);
SELECT * FROM error_fields($$SELECT idempotency.idempotent_call('k-detail', NULL, 'INSERT INTO strict_values VALUES ($1)', -1)$$);
SELECT count(*) AS stored FROM idempotency.keys WHERE key = 'k-detail';

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
-- Counted before any statement is analysed: the second statement's table
-- does not exist until the first has run.
SELECT sqlstate_of($$SELECT idempotency.idempotent_call('k-two', NULL, 'CREATE TEMP TABLE t1(a int); SELECT * FROM t1')$$);
SELECT sqlstate_of($$SELECT idempotency.idempotent_call('k-two', NULL, 'SELEC 1')$$);
-- A syntax error in fn is positioned in fn's text, shown as its QUERY, as
-- SPI shows the statements it parses: the cursor is not in the caller's
-- statement, nor in the text of an EXECUTE that made the call.
SELECT idempotency.idempotent_call('k-two', NULL, 'SELECT 1 + SELEC 2');
DO $$ BEGIN EXECUTE 'SELECT idempotency.idempotent_call(''k-two'', NULL, ''SELEC 1'')'; END $$;
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
-- up in the lock table (max_locks_per_transaction is 64 by default, 128
-- from PostgreSQL 19 on).
SELECT current_setting('max_locks_per_transaction')::int <= 128 AS lock_table_far_smaller;
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
SELECT count(*) AS through_index FROM idempotency.keys WHERE created_at > '-infinity' \gset
RESET enable_seqscan;
RESET enable_bitmapscan;
SET enable_indexscan = off;
SET enable_bitmapscan = off;
SELECT count(*) = :through_index AS heap_and_index_agree FROM idempotency.keys WHERE created_at > '-infinity';
RESET enable_indexscan;
RESET enable_bitmapscan;
DROP INDEX idempotency.keys_created_at;

-- DISCARD ALL (what a connection pooler sends before handing the
-- connection to another client) forgets the session's last call.
SELECT idempotency.idempotent_call('k-discard', NULL, 'SELECT 1') AS response, idempotency.last_call_replayed() AS replayed;
DISCARD ALL;
SELECT idempotency.last_call_replayed() IS NULL AS forgotten;
-- A call within a transaction block stays known: DISCARD ALL refuses to run there.
BEGIN;
SELECT idempotency.idempotent_call('k-discard', NULL, 'SELECT 1') AS response, idempotency.last_call_replayed() AS replayed;
SAVEPOINT before_discard;
DISCARD ALL;
ROLLBACK TO before_discard;
SELECT idempotency.last_call_replayed() AS replayed;
COMMIT;
