-- Calls in odd contexts: force_parallel_mode, read-only sessions, cursors
-- (also WITH HOLD, evaluated at COMMIT), set-returning queries, triggers
-- and prepared statements. The rule everywhere: the first evaluation of a
-- key runs fn, every later evaluation in the same or a later transaction
-- replays it; an evaluation that must write where writing is impossible
-- fails with PostgreSQL's own error and stores nothing.
\i sql/include/setup.sql
SET client_min_messages = warning;
DROP SCHEMA IF EXISTS hostile_contexts CASCADE;
RESET client_min_messages;
CREATE SCHEMA hostile_contexts;
SET search_path = hostile_contexts, public;

CREATE TABLE runs (label text);
CREATE FUNCTION run(label text) RETURNS text LANGUAGE sql
  AS $$ INSERT INTO hostile_contexts.runs VALUES (label) RETURNING 'ran ' || label $$;
CREATE FUNCTION runs_of(label text) RETURNS bigint LANGUAGE sql
  AS $$ SELECT count(*) FROM hostile_contexts.runs WHERE runs.label = runs_of.label $$;

-- Parallel query forced (force_parallel_mode, debug_parallel_query from
-- PostgreSQL 16 on): idempotent_call is PARALLEL UNSAFE, so a query that
-- calls it is never handed to a parallel worker and runs as usual.
SELECT CASE WHEN current_setting('server_version_num')::int >= 160000
            THEN 'debug_parallel_query' ELSE 'force_parallel_mode' END AS parallel_setting \gset
SET :parallel_setting = on;
SELECT idempotency.idempotent_call('ctx-parallel', NULL, 'SELECT hostile_contexts.run($1)', 'parallel');
SELECT idempotency.idempotent_call('ctx-parallel', NULL, 'SELECT hostile_contexts.run($1)', 'parallel'), idempotency.last_call_replayed();
SELECT runs_of('parallel');
-- A wrapper that lies about being parallel safe does reach a worker: there
-- a done key still replays, but running fn is refused (25000).
CREATE FUNCTION lying_wrapper(key text, label text) RETURNS jsonb LANGUAGE plpgsql PARALLEL SAFE AS $$
BEGIN
  RETURN idempotency.idempotent_call(key, NULL, 'SELECT hostile_contexts.run($1)', label);
END $$;
EXPLAIN (COSTS OFF) SELECT lying_wrapper('ctx-parallel', 'parallel');
SELECT lying_wrapper('ctx-parallel', 'parallel');
SELECT sqlstate_of($$SELECT hostile_contexts.lying_wrapper('ctx-parallel-new', 'parallel-new')$$);
RESET :parallel_setting;
SELECT count(*) AS stored FROM idempotency.keys WHERE key = 'ctx-parallel-new';
SELECT runs_of('parallel'), runs_of('parallel-new');

-- default_transaction_read_only: replays work, running fn is 25006.
SET default_transaction_read_only = on;
SELECT idempotency.idempotent_call('ctx-parallel', NULL, 'SELECT hostile_contexts.run($1)', 'parallel'), idempotency.last_call_replayed();
SELECT sqlstate_of($$SELECT idempotency.idempotent_call('ctx-read-only', NULL, 'SELECT hostile_contexts.run($1)', 'read-only')$$);
-- even when fn itself would only read.
SELECT sqlstate_of($$SELECT idempotency.idempotent_call('ctx-read-only', NULL, 'SELECT 1')$$);
RESET default_transaction_read_only;
SELECT count(*) AS stored FROM idempotency.keys WHERE key = 'ctx-read-only';
SELECT idempotency.idempotent_call('ctx-read-only', NULL, 'SELECT hostile_contexts.run($1)', 'read-only'), idempotency.last_call_replayed();

-- A cursor over calls with one key: the first fetch runs fn, later fetches
-- and a fetch backwards (which evaluates the row again) replay.
BEGIN;
DECLARE calls SCROLL CURSOR FOR
  SELECT g, idempotency.idempotent_call('ctx-cursor', NULL, 'SELECT hostile_contexts.run($1)', 'cursor') AS response
    FROM generate_series(1, 3) AS g;
FETCH 1 FROM calls;
SELECT idempotency.last_call_replayed();
FETCH 2 FROM calls;
SELECT idempotency.last_call_replayed();
FETCH BACKWARD 1 FROM calls;
SELECT idempotency.last_call_replayed();
COMMIT;
SELECT runs_of('cursor');
-- A cursor closed before its calls were fetched ran none of them.
BEGIN;
DECLARE unfetched CURSOR FOR
  SELECT idempotency.idempotent_call('ctx-unfetched-' || g, NULL, 'SELECT hostile_contexts.run($1)', 'unfetched')
    FROM generate_series(1, 3) AS g;
FETCH 1 FROM unfetched;
CLOSE unfetched;
COMMIT;
SELECT key FROM idempotency.keys WHERE key LIKE 'ctx-unfetched-%' ORDER BY key;
-- A WITH HOLD cursor evaluates its remaining rows during COMMIT: those calls
-- run fn then and commit with the transaction.
BEGIN;
DECLARE held CURSOR WITH HOLD FOR
  SELECT g, idempotency.idempotent_call('ctx-held-' || g, NULL, 'SELECT hostile_contexts.run($1)', 'held') AS response
    FROM generate_series(1, 3) AS g;
FETCH 1 FROM held;
SELECT count(*) AS stored_before_commit FROM idempotency.keys WHERE key LIKE 'ctx-held-%';
COMMIT;
SELECT count(*) AS stored_after_commit FROM idempotency.keys WHERE key LIKE 'ctx-held-%';
FETCH ALL FROM held;
CLOSE held;
SELECT runs_of('held');
-- A WITH HOLD cursor whose transaction rolls back runs nothing for good.
BEGIN;
DECLARE held_rollback CURSOR WITH HOLD FOR
  SELECT idempotency.idempotent_call('ctx-held-rollback', NULL, 'SELECT hostile_contexts.run($1)', 'held-rollback');
FETCH 1 FROM held_rollback;
ROLLBACK;
SELECT count(*) AS stored FROM idempotency.keys WHERE key = 'ctx-held-rollback';

-- Set-returning context. The same key and request on every row: the first
-- row runs fn, the others replay (pinned: not an error).
SELECT g, idempotency.idempotent_call('ctx-srf', NULL, 'SELECT hostile_contexts.run($1)', 'srf') AS response
  FROM generate_series(1, 3) AS g;
SELECT runs_of('srf');
-- The same key with a different request on a later row: IK422 for the
-- statement, and the first row's run is rolled back with it.
SELECT sqlstate_of($$SELECT idempotency.idempotent_call('ctx-srf-mixed', NULL, 'SELECT hostile_contexts.run($1)', 'srf-mixed-' || g)
  FROM generate_series(1, 3) AS g$$);
SELECT count(*) AS stored FROM idempotency.keys WHERE key = 'ctx-srf-mixed';
SELECT count(*) AS runs FROM runs WHERE label LIKE 'srf-mixed-%';
-- Distinct keys per row, under LIMIT: only the rows produced ran.
SELECT idempotency.idempotent_call('ctx-limit-' || g, NULL, 'SELECT hostile_contexts.run($1)', 'limit')
  FROM generate_series(1, 1000) AS g LIMIT 2;
SELECT runs_of('limit');
-- A set-returning fn inside the call: its rows are the response.
SELECT idempotency.idempotent_call('ctx-srf-fn', NULL, 'SELECT generate_series(1, 3)');

-- Row triggers: each row's key runs once; the same rows again replay.
CREATE TABLE orders (id int, receipt jsonb);
CREATE FUNCTION take_order() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
  NEW.receipt := idempotency.idempotent_call('ctx-order-' || NEW.id, NULL,
                   'SELECT hostile_contexts.run($1)', 'order ' || NEW.id);
  RETURN NEW;
END $$;
CREATE TRIGGER take_order BEFORE INSERT ON orders FOR EACH ROW EXECUTE FUNCTION take_order();
INSERT INTO orders VALUES (1), (2), (1);
INSERT INTO orders VALUES (2);
SELECT id, receipt FROM orders ORDER BY id;
SELECT label, count(*) AS runs FROM runs WHERE label LIKE 'order %' GROUP BY label ORDER BY label;

-- A prepared statement with a generic plan (forced, and shown: the plan
-- keeps the parameter $1 instead of the key), the call run many times.
SET plan_cache_mode = force_generic_plan;
PREPARE call_once(text) AS
  SELECT idempotency.idempotent_call($1, NULL, 'SELECT hostile_contexts.run($1)', 'prepared');
EXPLAIN (VERBOSE, COSTS OFF) EXECUTE call_once('ctx-prepared');
EXECUTE call_once('ctx-prepared');
EXECUTE call_once('ctx-prepared');
EXECUTE call_once('ctx-prepared');
EXECUTE call_once('ctx-prepared');
EXECUTE call_once('ctx-prepared');
EXECUTE call_once('ctx-prepared');
EXECUTE call_once('ctx-prepared');
SELECT runs_of('prepared');
DEALLOCATE call_once;
RESET plan_cache_mode;

DELETE FROM idempotency.keys WHERE key LIKE 'ctx-%';
SET client_min_messages = warning;
DROP SCHEMA hostile_contexts CASCADE;
RESET client_min_messages;
RESET search_path;
