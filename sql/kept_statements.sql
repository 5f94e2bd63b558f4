-- The statements that write idempotency.keys are prepared once per backend
-- and made again when the table changes, in the same session: a column of
-- 1.1 dropped (the table of 1.0) and added back, the indexes rebuilt
-- concurrently, a BEFORE trigger added and dropped. Runs in a database of
-- its own: it changes the key table.
CREATE DATABASE regress_kept_statements;
\c regress_kept_statements
CREATE EXTENSION idempotency;
\set VERBOSITY sqlstate
SET idempotency.remember = '2 days';
SELECT idempotency.idempotent_call('ks-1', NULL, 'SELECT 1');
SELECT key, remember_for FROM idempotency.keys WHERE key = 'ks-1';
-- Without remember_for, as 1.0 made the table, a key stores no window.
ALTER TABLE idempotency.keys DROP COLUMN remember_for;
SELECT idempotency.idempotent_call('ks-2', NULL, 'SELECT 2');
SELECT key FROM idempotency.keys WHERE key = 'ks-2';
-- Added back, the column holds the window again.
ALTER TABLE idempotency.keys ADD COLUMN remember_for interval;
SELECT idempotency.idempotent_call('ks-3', NULL, 'SELECT 3');
SELECT key, remember_for FROM idempotency.keys WHERE key = 'ks-3';
-- New index entries after the indexes were rebuilt: the replay finds them.
REINDEX TABLE CONCURRENTLY idempotency.keys;
SELECT idempotency.idempotent_call('ks-4', NULL, 'SELECT 4');
SELECT idempotency.idempotent_call('ks-4', NULL, 'SELECT 4');
SELECT idempotency.last_call_replayed() AS ks_4_replayed;
-- A BEFORE trigger added now sees the row, and may not move it.
CREATE FUNCTION public.rename_key() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
  NEW.key := NEW.key || '-renamed';
  RETURN NEW;
END $$;
CREATE TRIGGER rename_key BEFORE INSERT ON idempotency.keys
  FOR EACH ROW EXECUTE FUNCTION public.rename_key();
SELECT idempotency.idempotent_call('ks-5', NULL, 'SELECT 5');
DROP TRIGGER rename_key ON idempotency.keys;
SELECT idempotency.idempotent_call('ks-5', NULL, 'SELECT 5');
SELECT key FROM idempotency.keys WHERE key LIKE 'ks-5%';
-- A key is forgotten by its row's version.
SELECT idempotency.forget('ks-1');
SELECT idempotency.forget('ks-1');
SELECT count(*) AS ks_1_rows FROM idempotency.keys WHERE key = 'ks-1';
\c contrib_regression
DROP DATABASE regress_kept_statements;
