-- idempotency.store_errors: errors of listed SQLSTATEs raised by fn are the
-- call's stored outcome.
\i sql/include/setup.sql

CREATE TEMP TABLE errors_started AS SELECT clock_timestamp() AS at;

CREATE TABLE se_ledger (amount int NOT NULL);
CREATE TABLE se_unique (id int PRIMARY KEY);
INSERT INTO se_unique VALUES (1);
-- Counts fn's runs whatever becomes of its transaction: nextval is never
-- rolled back.
CREATE SEQUENCE se_runs;

-- Writes to the ledger, then declines with P0001 (detail and hint set).
CREATE FUNCTION se_decline(amount int) RETURNS jsonb LANGUAGE plpgsql AS $$
BEGIN
  PERFORM nextval('se_runs');
  INSERT INTO se_ledger VALUES (amount);
  RAISE EXCEPTION 'insufficient funds for %', amount
    USING DETAIL = 'balance is 100', HINT = 'top up first';
END $$;

-- Writes to the ledger, then breaks a unique constraint (23505).
CREATE FUNCTION se_duplicate(amount int) RETURNS jsonb LANGUAGE plpgsql AS $$
BEGIN
  PERFORM nextval('se_runs');
  INSERT INTO se_ledger VALUES (amount);
  INSERT INTO se_unique VALUES (1);
  RETURN '{}';
END $$;

-- Writes to the ledger, then divides by zero (22012).
CREATE FUNCTION se_divide(amount int) RETURNS jsonb LANGUAGE plpgsql AS $$
BEGIN
  PERFORM nextval('se_runs');
  INSERT INTO se_ledger VALUES (amount);
  RETURN to_jsonb(amount / 0);
END $$;

CREATE FUNCTION se_runs() RETURNS bigint LANGUAGE sql AS $$
  SELECT CASE WHEN is_called THEN last_value ELSE 0 END FROM se_runs
$$;

-- The setting: SQLSTATEs and classes, checked when set (22023).
SHOW idempotency.store_errors;
SET idempotency.store_errors = 'P0001, 23';
SHOW idempotency.store_errors;
SET idempotency.store_errors = ' p0001 ,23 ';
SHOW idempotency.store_errors;
SET idempotency.store_errors = P0001, '22012';
SHOW idempotency.store_errors;
RESET idempotency.store_errors;
SELECT sqlstate_of($$SET idempotency.store_errors = 'P001'$$);
SELECT sqlstate_of($$SET idempotency.store_errors = 'P0001,'$$);
SELECT sqlstate_of($$SET idempotency.store_errors = 'P0001 23'$$);
SELECT sqlstate_of($$SET idempotency.store_errors = 'P0-01'$$);
SELECT sqlstate_of($$SET idempotency.store_errors = '2'$$);
-- Transient conditions and non-errors are refused: a cancel or a
-- serialization failure must never become a request's permanent answer.
SELECT sqlstate_of($$SET idempotency.store_errors = '57014'$$);
SELECT sqlstate_of($$SET idempotency.store_errors = '40001'$$);
SELECT sqlstate_of($$SET idempotency.store_errors = '40'$$);
SELECT sqlstate_of($$SET idempotency.store_errors = '53'$$);
SELECT sqlstate_of($$SET idempotency.store_errors = '08006'$$);
SELECT sqlstate_of($$SET idempotency.store_errors = 'XX000'$$);
SELECT sqlstate_of($$SET idempotency.store_errors = 'IK409'$$);
SELECT sqlstate_of($$SET idempotency.store_errors = '00000'$$);
SELECT sqlstate_of($$SET idempotency.store_errors = '01'$$);
SELECT sqlstate_of($$SET idempotency.store_errors = '$$ || repeat('P0001,', 64) || $$P0001'$$);
SELECT sqlstate_of($$SET idempotency.store_errors = '$$ || repeat('P0001,', 63) || $$P0001'$$);
SHOW idempotency.store_errors;
RESET idempotency.store_errors;

-- With the setting empty an error of fn propagates and nothing is stored;
-- a retry runs fn again.
SELECT sqlstate_of($$SELECT idempotency.idempotent_call('se-plain', NULL, 'SELECT se_decline($1)', 300)$$);
SELECT sqlstate_of($$SELECT idempotency.idempotent_call('se-plain', NULL, 'SELECT se_decline($1)', 300)$$);
SELECT se_runs() AS runs, (SELECT count(*) FROM se_ledger) AS ledger_rows,
       (SELECT count(*) FROM idempotency.keys WHERE key = 'se-plain') AS stored;

-- Listed: fn's effects are undone, the error is stored and returned as the
-- response; the caller's transaction goes on and commits its own work.
SET idempotency.store_errors = 'P0001, 23';
SELECT setval('se_runs', 1, false);
BEGIN;
INSERT INTO se_ledger VALUES (-1);
SELECT idempotency.idempotent_call('se-declined', NULL, 'SELECT se_decline($1)', 300) AS response;
SELECT outcome, expires_at - created_at AS ttl FROM idempotency.last_call();
SELECT idempotency.last_call_replayed();
INSERT INTO se_ledger VALUES (-2);
COMMIT;
SELECT se_runs() AS runs, array_agg(amount ORDER BY amount) AS ledger FROM se_ledger;

-- Every retry gets the same document and fn does not run again, even with
-- the setting cleared.
SELECT idempotency.idempotent_call('se-declined', NULL, 'SELECT se_decline($1)', 300) AS response;
SELECT outcome FROM idempotency.last_call();
SELECT idempotency.last_call_replayed();
RESET idempotency.store_errors;
SELECT idempotency.idempotent_call('se-declined', NULL, 'SELECT se_decline($1)', 300)::text
     = (SELECT response::text FROM idempotency.keys WHERE key = 'se-declined') AS same_document;
SELECT outcome FROM idempotency.last_call();
SELECT se_runs() AS runs;
-- The same key with another request is still IK422.
SELECT sqlstate_of($$SELECT idempotency.idempotent_call('se-declined', NULL, 'SELECT se_decline($1)', 301)$$);

-- A class matches every SQLSTATE in it: 23505 through '23'.
SET idempotency.store_errors = '23';
SELECT idempotency.idempotent_call('se-duplicate', NULL, 'SELECT se_duplicate($1)', 5) #> '{error,sqlstate}' AS sqlstate;
SELECT outcome FROM idempotency.last_call();
SELECT count(*) AS ledger_rows_of_5 FROM se_ledger WHERE amount = 5;

-- An error outside the list propagates; nothing is stored, the caller's
-- transaction fails as it always did.
BEGIN;
INSERT INTO se_ledger VALUES (-3);
SELECT idempotency.idempotent_call('se-divide', NULL, 'SELECT se_divide($1)', 7);
COMMIT;
SELECT count(*) AS stored FROM idempotency.keys WHERE key = 'se-divide';
SELECT count(*) AS ledger_rows FROM se_ledger WHERE amount IN (-3, 7);
SELECT count(*) AS last_call_rows FROM idempotency.last_call();
-- Listed now: stored on the next delivery.
SET idempotency.store_errors = '22012';
SELECT idempotency.idempotent_call('se-divide', NULL, 'SELECT se_divide($1)', 7) #>> '{error,message}' AS message;
SELECT outcome FROM idempotency.last_call();

-- A fn that succeeds runs as ever with the setting on: ran, effects kept.
SET idempotency.store_errors = 'P0001';
SELECT idempotency.idempotent_call('se-ok', NULL, 'INSERT INTO se_ledger VALUES ($1) RETURNING amount', 42);
SELECT outcome FROM idempotency.last_call();
SELECT idempotency.idempotent_call('se-ok', NULL, 'INSERT INTO se_ledger VALUES ($1) RETURNING amount', 42);
SELECT outcome FROM idempotency.last_call();
SELECT count(*) AS ledger_rows_of_42 FROM se_ledger WHERE amount = 42;

-- Errors of the call's own arguments are never stored (a NULL fn is 22004
-- with class 22 listed); fn's errors include planning it (42601).
SET idempotency.store_errors = '22, 42';
SELECT sqlstate_of($$SELECT idempotency.idempotent_call('se-null-fn', NULL, NULL)$$);
SELECT count(*) AS stored FROM idempotency.keys WHERE key = 'se-null-fn';
SELECT idempotency.idempotent_call('se-syntax', NULL, 'SELEC 1') #>> '{error,sqlstate}' AS sqlstate;

-- Inside fn's subtransaction a nested call's claim and row go with the
-- error; the outer call's stored error is all that remains.
SET idempotency.store_errors = 'P0001';
SELECT idempotency.idempotent_call('se-outer', NULL,
  $$SELECT idempotency.idempotent_call('se-inner', NULL, 'SELECT 1'), se_decline(9)$$) #>> '{error,sqlstate}' AS sqlstate;
SELECT key FROM idempotency.keys WHERE key IN ('se-outer', 'se-inner') ORDER BY key;

-- Transient conditions are never stored, even when their class is listed:
-- with 55 listed, a lock_timeout inside fn (55P03) propagates unchanged,
-- undoes fn's effects and stores nothing; the retry runs fn again, and once
-- the lock is gone its result is stored. A prepared transaction holds the
-- lock fn waits for.
CREATE TABLE se_locked (id int);
CREATE FUNCTION se_lock(amount int) RETURNS jsonb LANGUAGE plpgsql AS $$
BEGIN
  PERFORM nextval('se_runs');
  INSERT INTO se_ledger VALUES (amount);
  LOCK TABLE se_locked IN ACCESS EXCLUSIVE MODE;
  RETURN to_jsonb(amount);
END $$;
BEGIN;
LOCK TABLE se_locked IN ACCESS EXCLUSIVE MODE;
PREPARE TRANSACTION 'se-lock-holder';
SELECT sqlstate_of($$SET idempotency.store_errors = '55P03'$$);
SELECT sqlstate_of($$SET idempotency.store_errors = '55, 57'$$);
SET idempotency.store_errors = '55';
SELECT setval('se_runs', 1, false);
SET lock_timeout = '100ms';
SELECT sqlstate_of($$SELECT idempotency.idempotent_call('se-lock', NULL, 'SELECT se_lock($1)', 11)$$);
SELECT sqlstate_of($$SELECT idempotency.idempotent_call('se-lock', NULL, 'SELECT se_lock($1)', 11)$$);
RESET lock_timeout;
-- statement_timeout inside fn (57014, which PL/pgSQL's WHEN OTHERS does not
-- catch): the same.
-- (Terse: PostgreSQL 19's context names the lock's relation by OID.)
SET statement_timeout = '100ms';
\set VERBOSITY terse
SELECT idempotency.idempotent_call('se-lock', NULL, 'SELECT se_lock($1)', 11);
\set VERBOSITY default
RESET statement_timeout;
SELECT se_runs() AS runs, (SELECT count(*) FROM se_ledger WHERE amount = 11) AS ledger_rows,
       (SELECT count(*) FROM idempotency.keys WHERE key = 'se-lock') AS stored;
COMMIT PREPARED 'se-lock-holder';
SELECT idempotency.idempotent_call('se-lock', NULL, 'SELECT se_lock($1)', 11) AS response;
SELECT outcome FROM idempotency.last_call();
SELECT se_runs() AS runs, (SELECT count(*) FROM se_ledger WHERE amount = 11) AS ledger_rows;

-- Every transient SQLSTATE of a listable class, raised by fn with its class
-- listed: propagated, never stored, fn runs on each retry. 55000, in the
-- same class, is stored.
CREATE FUNCTION se_raise(code text) RETURNS jsonb LANGUAGE plpgsql AS $$
BEGIN
  PERFORM nextval('se_runs');
  RAISE EXCEPTION 'condition %', code USING ERRCODE = code;
END $$;
SET idempotency.store_errors = '25, 55, HV';
SELECT setval('se_runs', 1, false);
SELECT code,
       sqlstate_of(format('SELECT idempotency.idempotent_call(%L, NULL, %L, %L::text)',
                          'se-' || code, 'SELECT se_raise($1)', code)) AS first,
       sqlstate_of(format('SELECT idempotency.idempotent_call(%L, NULL, %L, %L::text)',
                          'se-' || code, 'SELECT se_raise($1)', code)) AS retry
  FROM unnest(ARRAY['25P03', '25P04', '55P03', '55006', 'HV00N']) AS code;
SELECT se_runs() AS runs,
       (SELECT count(*) FROM idempotency.keys WHERE key LIKE 'se-%' AND key <> 'se-55000'
          AND response #>> '{error,sqlstate}' IN ('25P03', '25P04', '55P03', '55006', 'HV00N')) AS stored;
SELECT idempotency.idempotent_call('se-55000', NULL, 'SELECT se_raise($1)', '55000'::text) #>> '{error,sqlstate}' AS stored_sqlstate;
DROP FUNCTION se_lock(int), se_raise(text);
DROP TABLE se_locked;

RESET idempotency.store_errors;
DROP FUNCTION se_decline(int), se_duplicate(int), se_divide(int), se_runs();
DROP SEQUENCE se_runs;
DROP TABLE se_ledger, se_unique;
DELETE FROM idempotency.keys WHERE created_at >= (SELECT at FROM errors_started);
