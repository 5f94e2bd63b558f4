-- What a DBA adds to idempotency.keys applies to the rows idempotent_call
-- writes, as it does to any INSERT: defaults of added columns, dropped
-- columns, constraints (NOT NULL, CHECK, EXCLUDE), row and statement triggers, partial
-- and expression indexes. A changed type of one of the extension's columns
-- is refused. Runs in a database of its own: it changes the key table.
CREATE DATABASE regress_store_dba;
\c regress_store_dba
CREATE EXTENSION idempotency;
-- How many rows one key has.
CREATE FUNCTION stored(k text) RETURNS bigint LANGUAGE sql
  AS $$ SELECT count(*) FROM idempotency.keys WHERE key = k $$;
\set VERBOSITY sqlstate

-- Added columns get their defaults: a constant, an identity, and several
-- columns added at once; a stored generated column is computed.
SELECT idempotency.idempotent_call('before-columns', NULL, 'SELECT 1');
ALTER TABLE idempotency.keys ADD COLUMN note int NOT NULL DEFAULT 5;
ALTER TABLE idempotency.keys ADD COLUMN serial_no bigint GENERATED ALWAYS AS IDENTITY;
ALTER TABLE idempotency.keys ADD COLUMN a int, ADD COLUMN b text DEFAULT 'b',
                             ADD COLUMN c numeric DEFAULT 1.5;
ALTER TABLE idempotency.keys
  ADD COLUMN key_bytes int GENERATED ALWAYS AS (octet_length(key)) STORED;
SELECT count(idempotency.idempotent_call('batch-' || g, NULL, 'SELECT $1', g))
  FROM generate_series(1, 50) AS g;
SELECT idempotency.idempotent_call('with-columns', NULL, 'SELECT 2');
SELECT count(*) AS batch_rows, bool_and(note = 5 AND a IS NULL AND b = 'b' AND c = 1.5
                                        AND key_bytes = octet_length(key)) AS defaults_applied,
       count(DISTINCT serial_no) AS distinct_serials
  FROM idempotency.keys WHERE key LIKE 'batch-%';
SELECT key, note, a, b, c, key_bytes FROM idempotency.keys
 WHERE key IN ('before-columns', 'with-columns') ORDER BY key;

-- Dropped columns are left out.
ALTER TABLE idempotency.keys DROP COLUMN a, DROP COLUMN c;
SELECT idempotency.idempotent_call('after-drop', NULL, 'SELECT 3');
SELECT key, note, b, key_bytes FROM idempotency.keys WHERE key = 'after-drop';

-- A NOT NULL column without a default refuses the row (23502): nothing is
-- stored, and the call can be made again once the column is fixed.
ALTER TABLE idempotency.keys ADD COLUMN required int NOT NULL DEFAULT 0;
ALTER TABLE idempotency.keys ALTER COLUMN required DROP DEFAULT;
SELECT idempotency.idempotent_call('needs-required', NULL, 'SELECT 4');
SELECT stored('needs-required');
ALTER TABLE idempotency.keys ALTER COLUMN required SET DEFAULT 7;
SELECT idempotency.idempotent_call('needs-required', NULL, 'SELECT 4');
SELECT key, required FROM idempotency.keys WHERE key = 'needs-required';
ALTER TABLE idempotency.keys DROP COLUMN required;

-- A column of the extension whose type was changed is refused (42804),
-- for new keys and replays alike, before anything is written; changed
-- back, the stored keys replay.
ALTER TABLE idempotency.keys ALTER COLUMN response TYPE json;
\set VERBOSITY terse
SELECT idempotency.idempotent_call('while-json', NULL, 'SELECT 5');
SELECT idempotency.idempotent_call('with-columns', NULL, 'SELECT 2');
\set VERBOSITY sqlstate
SELECT stored('while-json');
ALTER TABLE idempotency.keys ALTER COLUMN response TYPE jsonb;
SELECT idempotency.idempotent_call('with-columns', NULL, 'SELECT 2'),
       idempotency.last_call_replayed();
-- A renamed column of the extension is missing (42703).
ALTER TABLE idempotency.keys RENAME COLUMN response TO answer;
\set VERBOSITY terse
SELECT idempotency.idempotent_call('while-renamed', NULL, 'SELECT 5');
\set VERBOSITY sqlstate
ALTER TABLE idempotency.keys RENAME COLUMN answer TO response;
SELECT stored('while-renamed');

-- CHECK constraints (23514).
ALTER TABLE idempotency.keys ADD CONSTRAINT key_short CHECK (octet_length(key) <= 20);
SELECT idempotency.idempotent_call('short-key', NULL, 'SELECT 6');
SELECT idempotency.idempotent_call('a-key-longer-than-twenty-bytes', NULL, 'SELECT 6');
SELECT stored('short-key'), stored('a-key-longer-than-twenty-bytes');
ALTER TABLE idempotency.keys DROP CONSTRAINT key_short;

-- Exclusion constraints (23P01): here, one key per request among the
-- keys named excl-*.
ALTER TABLE idempotency.keys ADD CONSTRAINT one_key_per_request
  EXCLUDE USING btree (request_hash WITH =) WHERE (key LIKE 'excl-%');
SELECT idempotency.idempotent_call('excl-1', 'request-x', 'SELECT 7');
SELECT idempotency.idempotent_call('excl-2', 'request-x', 'SELECT 7');
SELECT idempotency.idempotent_call('other', 'request-x', 'SELECT 7');
SELECT stored('excl-1'), stored('excl-2'), stored('other');
ALTER TABLE idempotency.keys DROP CONSTRAINT one_key_per_request;

-- NOT NULL on response is refused (0A000): a tombstone has no response.
-- A CHECK that requires it of live keys refuses a call whose response is
-- SQL NULL (fn returned no row), 23514.
ALTER TABLE idempotency.keys ALTER COLUMN response SET NOT NULL;
ALTER TABLE idempotency.keys ADD CONSTRAINT live_keys_respond
  CHECK (response IS NOT NULL OR expired_at IS NOT NULL);
SELECT idempotency.idempotent_call('null-response', NULL, 'SELECT 1 WHERE false');
SELECT stored('null-response');
ALTER TABLE idempotency.keys DROP CONSTRAINT live_keys_respond;
SELECT idempotency.idempotent_call('null-response', NULL, 'SELECT 1 WHERE false') IS NULL AS sql_null;
SELECT stored('null-response');

-- Row triggers: a BEFORE trigger that changes the row, and an AFTER
-- trigger that audits the row as stored.
CREATE TABLE audit (key text, note int, response jsonb);
CREATE FUNCTION mark_note() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
  NEW.note := 42;
  RETURN NEW;
END $$;
CREATE FUNCTION audit_key() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
  INSERT INTO public.audit VALUES (NEW.key, NEW.note, NEW.response);
  RETURN NULL;
END $$;
CREATE TRIGGER mark_note BEFORE INSERT ON idempotency.keys
  FOR EACH ROW EXECUTE FUNCTION mark_note();
CREATE TRIGGER audit_key AFTER INSERT ON idempotency.keys
  FOR EACH ROW EXECUTE FUNCTION audit_key();
SELECT idempotency.idempotent_call('triggered', NULL, 'SELECT 8');
SELECT idempotency.idempotent_call('triggered', NULL, 'SELECT 8'),
       idempotency.last_call_replayed();
SELECT key, note FROM idempotency.keys WHERE key = 'triggered';
SELECT * FROM audit;
-- A key rolled back with its transaction leaves no audit row.
BEGIN;
SELECT idempotency.idempotent_call('rolled-back', NULL, 'SELECT 9');
ROLLBACK;
SELECT count(*) AS audited_rolled_back FROM audit WHERE key = 'rolled-back';
DROP TRIGGER mark_note ON idempotency.keys;

-- A BEFORE trigger may not skip the row or move it to another key (09000):
-- a retry would run the request again.
CREATE FUNCTION skip_row() RETURNS trigger LANGUAGE plpgsql
  AS $$ BEGIN RETURN NULL; END $$;
CREATE TRIGGER skip_row BEFORE INSERT ON idempotency.keys
  FOR EACH ROW EXECUTE FUNCTION skip_row();
SELECT idempotency.idempotent_call('skipped', NULL, 'SELECT 10');
DROP TRIGGER skip_row ON idempotency.keys;
CREATE FUNCTION rename_key() RETURNS trigger LANGUAGE plpgsql
  AS $$ BEGIN NEW.key := NEW.key || '-renamed'; RETURN NEW; END $$;
CREATE TRIGGER rename_key BEFORE INSERT ON idempotency.keys
  FOR EACH ROW EXECUTE FUNCTION rename_key();
SELECT idempotency.idempotent_call('renamed', NULL, 'SELECT 11');
DROP TRIGGER rename_key ON idempotency.keys;
CREATE FUNCTION redigest_key() RETURNS trigger LANGUAGE plpgsql
  AS $$ BEGIN NEW.key_digest := idempotency.key_digest('elsewhere'); RETURN NEW; END $$;
CREATE TRIGGER redigest_key BEFORE INSERT ON idempotency.keys
  FOR EACH ROW EXECUTE FUNCTION redigest_key();
SELECT idempotency.idempotent_call('redigested', NULL, 'SELECT 12');
DROP TRIGGER redigest_key ON idempotency.keys;
SELECT count(*) AS skipped_or_renamed FROM idempotency.keys
 WHERE key IN ('skipped', 'renamed', 'renamed-renamed', 'redigested');
DROP TRIGGER audit_key ON idempotency.keys;

-- Statement triggers fire as for a one-row INSERT: BEFORE and AFTER, the
-- AFTER one with the stored row in its transition table.
CREATE TABLE statements (moment text, rows_seen bigint);
CREATE FUNCTION before_statement() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
  INSERT INTO public.statements VALUES ('before', NULL);
  RETURN NULL;
END $$;
CREATE FUNCTION after_statement() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
  INSERT INTO public.statements
    SELECT 'after ' || string_agg(key, ','), count(*) FROM stored_rows;
  RETURN NULL;
END $$;
CREATE TRIGGER before_statement BEFORE INSERT ON idempotency.keys
  FOR EACH STATEMENT EXECUTE FUNCTION before_statement();
CREATE TRIGGER after_statement AFTER INSERT ON idempotency.keys
  REFERENCING NEW TABLE AS stored_rows
  FOR EACH STATEMENT EXECUTE FUNCTION after_statement();
SELECT idempotency.idempotent_call('per-statement', NULL, 'SELECT 12');
SELECT idempotency.idempotent_call('per-statement', NULL, 'SELECT 12'),
       idempotency.last_call_replayed();
SELECT * FROM statements;
DROP TRIGGER before_statement ON idempotency.keys;
DROP TRIGGER after_statement ON idempotency.keys;

-- Partial and expression indexes get the row's entries; a unique
-- expression index is enforced (23505). A unique index over the key's text
-- must leave tombstones out, whose text is empty (0A000 otherwise).
CREATE INDEX keys_upper_key ON idempotency.keys (upper(key)) WHERE note > 0;
CREATE UNIQUE INDEX keys_lower_key ON idempotency.keys (lower(key));
ALTER TABLE idempotency.keys ADD CONSTRAINT keys_scope_key UNIQUE (scope, key);
CREATE UNIQUE INDEX keys_lower_key ON idempotency.keys (lower(key))
  WHERE expired_at IS NULL;
SELECT idempotency.idempotent_call('Indexed', NULL, 'SELECT 12');
SELECT idempotency.idempotent_call('INDEXED', NULL, 'SELECT 12');
SELECT stored('Indexed'), stored('INDEXED');
SET enable_seqscan = off;
SET enable_bitmapscan = off;
EXPLAIN (COSTS OFF) SELECT key FROM idempotency.keys WHERE upper(key) = 'INDEXED' AND note > 0;
SELECT key FROM idempotency.keys WHERE upper(key) = 'INDEXED' AND note > 0;
RESET enable_seqscan;
RESET enable_bitmapscan;

-- Whatever the DBA changed, one key has one row, and replays work.
SELECT idempotency.idempotent_call('before-columns', NULL, 'SELECT 1'),
       idempotency.last_call_replayed();
SELECT count(*) = count(DISTINCT (scope, key)) AS one_row_per_key FROM idempotency.keys;

\c contrib_regression
DROP DATABASE regress_store_dba;
