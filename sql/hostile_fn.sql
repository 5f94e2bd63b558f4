-- Hostile and odd fn: statements that cannot run inside a function or that
-- try to control the transaction, statements aimed at the key table,
-- cursors, a sleep cancelled by statement_timeout, and nested calls. Every
-- failed call stores nothing, and the next call with the same key runs fn.
\i sql/include/setup.sql
SET client_min_messages = warning;
DROP SCHEMA IF EXISTS hostile_fn CASCADE;
RESET client_min_messages;
CREATE SCHEMA hostile_fn;
SET search_path = hostile_fn, public;

CREATE TABLE runs (label text);
CREATE FUNCTION run(label text) RETURNS text LANGUAGE sql
  AS $$ INSERT INTO hostile_fn.runs VALUES (label) RETURNING 'ran ' || label $$;
-- How many keys of this file are stored.
CREATE FUNCTION stored() RETURNS bigint LANGUAGE sql
  AS $$ SELECT count(*) FROM idempotency.keys WHERE key LIKE 'fn-%' $$;

-- Statements that refuse to run inside a function: 25001.
SELECT sqlstate_of($$SELECT idempotency.idempotent_call('fn-utility', NULL, 'VACUUM hostile_fn.runs')$$);
SELECT sqlstate_of($$SELECT idempotency.idempotent_call('fn-utility', NULL, 'CREATE DATABASE regress_hostile_fn_db')$$);
SELECT sqlstate_of($$SELECT idempotency.idempotent_call('fn-utility', NULL, 'CREATE INDEX CONCURRENTLY ON hostile_fn.runs (label)')$$);
SELECT sqlstate_of($$SELECT idempotency.idempotent_call('fn-utility', NULL, 'ALTER SYSTEM SET work_mem = ''1MB''')$$);
-- Transaction control, directly or from a procedure or DO block: 2D000.
CREATE PROCEDURE commits() LANGUAGE plpgsql AS $$ BEGIN COMMIT; END $$;
SELECT sqlstate_of($$SELECT idempotency.idempotent_call('fn-tx', NULL, 'SAVEPOINT s')$$);
SELECT sqlstate_of($$SELECT idempotency.idempotent_call('fn-tx', NULL, 'ROLLBACK')$$);
SELECT sqlstate_of($$SELECT idempotency.idempotent_call('fn-tx', NULL, 'BEGIN')$$);
SELECT sqlstate_of($$SELECT idempotency.idempotent_call('fn-tx', NULL, 'PREPARE TRANSACTION ''fn-tx''')$$);
SELECT sqlstate_of($$SELECT idempotency.idempotent_call('fn-tx', NULL, 'CALL hostile_fn.commits()')$$);
SELECT sqlstate_of($$SELECT idempotency.idempotent_call('fn-tx', NULL, 'DO $do$ BEGIN ROLLBACK; END $do$')$$);
-- COPY with the client: 0A000.
SELECT sqlstate_of($$SELECT idempotency.idempotent_call('fn-copy', NULL, 'COPY hostile_fn.runs TO STDOUT')$$);
SELECT sqlstate_of($$SELECT idempotency.idempotent_call('fn-copy', NULL, 'COPY hostile_fn.runs FROM STDIN')$$);
SELECT stored(), (SELECT count(*) FROM runs) AS runs;
-- After all these, the keys are free: each runs fn now.
SELECT idempotency.idempotent_call(k, NULL, 'SELECT hostile_fn.run($1)', k)
  FROM unnest(ARRAY['fn-utility', 'fn-tx', 'fn-copy']) AS k;

-- The key table from inside fn, as a role that does not own it: it can be
-- read (its own keys only) and locked for reading, nothing more.
CREATE ROLE regress_hostile_fn_user;
GRANT USAGE ON SCHEMA hostile_fn TO regress_hostile_fn_user;
SET ROLE regress_hostile_fn_user;
SELECT sqlstate_of($$SELECT idempotency.idempotent_call('fn-keys', NULL, 'LOCK TABLE idempotency.keys')$$);
SELECT sqlstate_of($$SELECT idempotency.idempotent_call('fn-keys', NULL, 'LOCK TABLE idempotency.keys IN SHARE ROW EXCLUSIVE MODE')$$);
SELECT sqlstate_of($$SELECT idempotency.idempotent_call('fn-keys', NULL, 'DELETE FROM idempotency.keys')$$);
SELECT sqlstate_of($$SELECT idempotency.idempotent_call('fn-keys', NULL, 'UPDATE idempotency.keys SET response = ''1''')$$);
SELECT sqlstate_of($$SELECT idempotency.idempotent_call('fn-keys', NULL, 'INSERT INTO idempotency.keys VALUES (current_user::regrole, ''fn-keys'', ''h'', ''1'', now(), now())')$$);
SELECT sqlstate_of($$SELECT idempotency.idempotent_call('fn-keys', NULL, 'TRUNCATE idempotency.keys')$$);
SELECT sqlstate_of($$SELECT idempotency.idempotent_call('fn-keys', NULL, 'SELECT key FROM idempotency.keys FOR UPDATE')$$);
SELECT sqlstate_of($$SELECT idempotency.idempotent_call('fn-keys', NULL, 'SELECT key FROM idempotency.keys FOR KEY SHARE')$$);
SELECT count(*) AS my_keys FROM idempotency.keys;
SELECT idempotency.idempotent_call('fn-keys-lock', NULL, 'LOCK TABLE idempotency.keys IN ACCESS SHARE MODE');
SELECT idempotency.idempotent_call('fn-keys-read', NULL, 'SELECT count(*) FROM idempotency.keys');
SELECT key, response FROM idempotency.keys ORDER BY key;
RESET ROLE;
-- The table owner may write the table inside fn; a row it plants for the
-- call's own key collides with the row the call stores (23505), and the
-- whole call rolls back.
SELECT sqlstate_of($$SELECT idempotency.idempotent_call('fn-planted', NULL, 'INSERT INTO idempotency.keys VALUES (current_user::regrole, ''fn-planted'', sha256(''h''), ''1'', now(), now() + interval ''1 day'', idempotency.key_digest(''fn-planted''))')$$);
-- Dropping the extension inside fn fails the call and rolls back the drop.
SELECT sqlstate_of($$SELECT idempotency.idempotent_call('fn-drop', NULL, 'DROP EXTENSION idempotency')$$);
SELECT extname FROM pg_extension WHERE extname = 'idempotency';
SELECT count(*) AS stored FROM idempotency.keys WHERE key IN ('fn-keys', 'fn-planted', 'fn-drop');

-- Cursors. fn may open a cursor: the response is SQL NULL and the cursor
-- lives on in the caller's transaction; a replay opens nothing.
BEGIN;
SELECT idempotency.idempotent_call('fn-declare', NULL, 'DECLARE fn_cursor CURSOR FOR SELECT g FROM generate_series(1, 3) AS g') IS NULL AS null_response;
FETCH ALL FROM fn_cursor;
COMMIT;
BEGIN;
SELECT idempotency.idempotent_call('fn-declare', NULL, 'DECLARE fn_cursor CURSOR FOR SELECT g FROM generate_series(1, 3) AS g') IS NULL AS null_response,
       idempotency.last_call_replayed();
SELECT sqlstate_of('FETCH ALL FROM fn_cursor');
COMMIT;
-- fn may fetch from the caller's cursor: the fetched rows are the response;
-- a replay answers them again without moving the cursor.
BEGIN;
DECLARE caller_cursor CURSOR FOR SELECT g FROM generate_series(1, 6) AS g;
SELECT idempotency.idempotent_call('fn-fetch', NULL, 'FETCH 2 FROM caller_cursor');
SELECT idempotency.idempotent_call('fn-fetch', NULL, 'FETCH 2 FROM caller_cursor'), idempotency.last_call_replayed();
FETCH ALL FROM caller_cursor;
COMMIT;

-- pg_sleep inside fn cancelled by statement_timeout: 57014, nothing stored,
-- and the retry (with time enough) runs fn.
CREATE FUNCTION slow(label text) RETURNS text LANGUAGE plpgsql AS $$
BEGIN
  INSERT INTO hostile_fn.runs VALUES (label);
  PERFORM pg_sleep(current_setting('hostile_fn.sleep')::float8);
  RETURN 'slept ' || label;
END $$;
SET hostile_fn.sleep = 30;
SET statement_timeout = '200ms';
\set VERBOSITY sqlstate
SELECT idempotency.idempotent_call('fn-sleep', NULL, 'SELECT hostile_fn.slow($1)', 'once');
\set VERBOSITY default
RESET statement_timeout;
SELECT count(*) AS stored FROM idempotency.keys WHERE key = 'fn-sleep';
SELECT count(*) AS runs FROM runs WHERE label = 'once';
SET hostile_fn.sleep = 0;
SELECT idempotency.idempotent_call('fn-sleep', NULL, 'SELECT hostile_fn.slow($1)', 'once'), idempotency.last_call_replayed();
SELECT count(*) AS runs FROM runs WHERE label = 'once';

-- Nesting. Three keys deep works; each inner key is stored with its own
-- response and replays on its own.
SELECT idempotency.idempotent_call('fn-nest-1', NULL,
  'SELECT idempotency.idempotent_call(''fn-nest-2'', NULL, ''SELECT idempotency.idempotent_call(''''fn-nest-3'''', NULL, ''''SELECT hostile_fn.run(''''''''three'''''''')'''')'')');
SELECT key, response FROM idempotency.keys WHERE key LIKE 'fn-nest-%' ORDER BY key;
SELECT idempotency.idempotent_call('fn-nest-3', NULL, 'SELECT hostile_fn.run(''three'')'), idempotency.last_call_replayed();
-- A key that comes back further down its own chain (A -> B -> A) is IK508,
-- and nothing of the chain is stored.
CREATE FUNCTION chain(outer_key text, inner_key text) RETURNS jsonb LANGUAGE sql AS $$
  SELECT idempotency.idempotent_call(inner_key, NULL,
    'SELECT idempotency.idempotent_call($1, NULL, ''SELECT hostile_fn.run(''''loop'''')'')', outer_key)
$$;
SELECT sqlstate_of($$SELECT idempotency.idempotent_call('fn-loop-a', NULL, 'SELECT hostile_fn.chain($1, $2)', 'fn-loop-a', 'fn-loop-b')$$);
SELECT count(*) AS stored FROM idempotency.keys WHERE key LIKE 'fn-loop-%';
-- An inner call that fails inside an exception block of fn rolls back alone:
-- the outer key is stored, the inner one is not and runs on its next call.
CREATE FUNCTION run_then_fail(label text) RETURNS text LANGUAGE plpgsql AS $$
BEGIN
  INSERT INTO hostile_fn.runs VALUES (label);
  RAISE division_by_zero;
END $$;
CREATE FUNCTION try_inner() RETURNS text LANGUAGE plpgsql AS $$
BEGIN
  PERFORM idempotency.idempotent_call('fn-inner', NULL, 'SELECT hostile_fn.run_then_fail(''inner'')');
  RETURN 'inner succeeded';
EXCEPTION WHEN division_by_zero THEN
  RETURN 'inner failed: ' || SQLERRM;
END $$;
SELECT idempotency.idempotent_call('fn-outer', NULL, 'SELECT hostile_fn.try_inner()');
SELECT key, response FROM idempotency.keys WHERE key IN ('fn-outer', 'fn-inner') ORDER BY key;
SELECT count(*) AS inner_runs FROM runs WHERE label = 'inner';
SELECT idempotency.idempotent_call('fn-inner', NULL, 'SELECT hostile_fn.run(''inner'')'), idempotency.last_call_replayed();
-- Inside fn, a key committed earlier replays like anywhere else.
SELECT idempotency.idempotent_call('fn-replay-inside', NULL,
  'SELECT idempotency.idempotent_call(''fn-inner'', NULL, ''SELECT hostile_fn.run(''''inner'''')'')');
SELECT count(*) AS inner_runs FROM runs WHERE label = 'inner';

-- The server is still up and answering.
SELECT idempotency.idempotent_call('fn-utility', NULL, 'SELECT hostile_fn.run($1)', 'fn-utility'), idempotency.last_call_replayed();

DELETE FROM idempotency.keys WHERE key LIKE 'fn-%';
SET client_min_messages = warning;
DROP SCHEMA hostile_fn CASCADE;
RESET client_min_messages;
-- A role that has keys is dropped after DROP OWNED BY, which deletes them.
DROP OWNED BY regress_hostile_fn_user;
DROP ROLE regress_hostile_fn_user;
RESET search_path;
