-- Many keys in one statement: claim_batch answers each key (claimed,
-- replayed, or refused with its IK SQLSTATE) without failing the others;
-- complete_batch stores many responses. Concurrent batches are in
-- test/isolation/specs/batch_claim.spec.

\i sql/include/setup.sql

CREATE SCHEMA batch;
CREATE TABLE batch.orders (key text NOT NULL, amount int NOT NULL);

\set VERBOSITY sqlstate

-- Claim locks this backend holds.
CREATE VIEW batch.claim_locks AS
  SELECT count(*) AS claim_locks FROM pg_locks
   WHERE pid = pg_backend_pid() AND locktype = 'advisory' AND objsubid < 0;

-- New keys: each claimed, one row per key in the order given; the
-- transaction holds every key until it completes them.
BEGIN;
SELECT ordinality, key, outcome, sqlstate, message, response, created_at, expires_at
  FROM idempotency.claim_batch(ARRAY['batch-b-3', 'batch-b-1', 'batch-b-2'], ARRAY['h3', 'h1', 'h2']);
SELECT * FROM batch.claim_locks;
SELECT key, state FROM unnest(ARRAY['batch-b-1', 'batch-b-2', 'batch-b-3']) AS key,
       LATERAL idempotency.lookup(key) ORDER BY key;
-- Nothing of a batch shows in last_call(), which tells of one key.
SELECT count(*) AS last_call_rows FROM idempotency.last_call();
INSERT INTO batch.orders SELECT k, 1 FROM unnest(ARRAY['batch-b-3', 'batch-b-1', 'batch-b-2']) AS k;
SELECT idempotency.complete_batch(ARRAY['batch-b-3', 'batch-b-1', 'batch-b-2'],
                                  ARRAY['{"n": 3}', '{"n": 1}', NULL]::jsonb[]);
SELECT * FROM batch.claim_locks;
COMMIT;

-- The same batch again: every key replays its own response and times, a
-- NULL response as NULL.
SELECT b.ordinality, b.key, b.outcome, b.sqlstate, b.response,
       b.created_at = l.created_at AND b.expires_at = l.expires_at AS times_are_stored
  FROM idempotency.claim_batch(ARRAY['batch-b-1', 'batch-b-2', 'batch-b-3'], ARRAY['h1', 'h2', 'h3']) AS b,
       LATERAL idempotency.lookup(b.key) AS l
 ORDER BY b.ordinality;
SELECT * FROM batch.claim_locks;

-- Mixed: a replay, a key with another request (IK422) and a new key. The
-- refusal is a row; the others' answers stand and the transaction goes on.
BEGIN;
SELECT ordinality, key, outcome, sqlstate, message, response
  FROM idempotency.claim_batch(ARRAY['batch-b-1', 'batch-b-2', 'batch-b-4'], ARRAY['h1', 'other', 'h4']);
SELECT idempotency.complete_batch(ARRAY['batch-b-4'], ARRAY['{"n": 4}'::jsonb]);
COMMIT;
SELECT response FROM idempotency.lookup('batch-b-4');

-- A key given twice: the first occurrence claims it, the later one gets
-- what a second claim() of a held key gets, IK508 (an answer, like any
-- error of class IK); done keys given twice replay twice.
BEGIN;
SELECT ordinality, key, outcome, sqlstate, message, response
  FROM idempotency.claim_batch(ARRAY['batch-dup', 'batch-b-1', 'batch-dup', 'batch-b-1'], ARRAY[NULL, 'h1', NULL, 'h1']);
-- A key held by claim() earlier in the transaction: IK508 too.
SELECT replayed FROM idempotency.claim('batch-single', NULL);
SELECT ordinality, key, outcome, sqlstate
  FROM idempotency.claim_batch(ARRAY['batch-single', 'batch-other-new'], NULL);
SELECT idempotency.complete_batch(ARRAY['batch-dup', 'batch-single', 'batch-other-new'],
                                  ARRAY['1', '2', '3']::jsonb[]);
COMMIT;
SELECT key, state, response FROM unnest(ARRAY['batch-dup', 'batch-single', 'batch-other-new']) AS key,
       LATERAL idempotency.lookup(key) ORDER BY key;

-- NULL request_hashes: every key claimed with a NULL request_hash, the same
-- request as claim(key, NULL).
BEGIN;
SELECT outcome FROM idempotency.claim_batch(ARRAY['batch-nohash'], NULL);
SELECT idempotency.complete_batch(ARRAY['batch-nohash'], ARRAY['"x"'::jsonb]);
COMMIT;
SELECT replayed, response FROM idempotency.claim('batch-nohash', NULL);
SELECT outcome, response FROM idempotency.claim_batch(ARRAY['batch-nohash'], ARRAY[NULL::text]);
SELECT outcome, sqlstate FROM idempotency.claim_batch(ARRAY['batch-nohash'], ARRAY['h']);

-- No keys: no rows.
SELECT count(*) FROM idempotency.claim_batch(ARRAY[]::text[], ARRAY[]::text[]);
SELECT count(*) FROM idempotency.claim_batch('{}', NULL);
SELECT idempotency.complete_batch('{}', '{}');

-- Bad input ends the statement with its SQLSTATE; no key of the batch is
-- taken, whatever its place.
SELECT sqlstate_of($$SELECT * FROM idempotency.claim_batch(NULL, NULL)$$);
SELECT sqlstate_of($$SELECT * FROM idempotency.claim_batch(ARRAY['batch-ok-1', NULL], NULL)$$);
SELECT sqlstate_of($$SELECT * FROM idempotency.claim_batch(ARRAY['batch-ok-1', ''], NULL)$$);
SELECT sqlstate_of(format('SELECT * FROM idempotency.claim_batch(ARRAY[%L, %L], NULL)',
                          'batch-ok-1', repeat('k', 256)));
SELECT sqlstate_of($$SELECT * FROM idempotency.claim_batch(ARRAY['batch-ok-1', 'batch-ok-2'], ARRAY['h'])$$);
SELECT sqlstate_of($$SELECT * FROM idempotency.claim_batch(ARRAY[['batch-ok-1'], ['batch-ok-2']], NULL)$$);
SELECT sqlstate_of($$SELECT idempotency.complete_batch(NULL, ARRAY['1'::jsonb])$$);
SELECT sqlstate_of($$SELECT idempotency.complete_batch(ARRAY['batch-ok-1'], NULL)$$);
SELECT sqlstate_of($$SELECT idempotency.complete_batch(ARRAY['batch-ok-1'], ARRAY['1', '2']::jsonb[])$$);
SELECT sqlstate_of($$SELECT idempotency.complete_batch(ARRAY[NULL], ARRAY['1'::jsonb])$$);
BEGIN;
SAVEPOINT s;
SELECT * FROM idempotency.claim_batch(ARRAY['batch-ok-1', 'batch-ok-2', NULL], NULL);
ROLLBACK TO s;
SELECT * FROM batch.claim_locks;
COMMIT;
SELECT state FROM idempotency.lookup('batch-ok-1');

-- complete_batch needs keys this transaction claimed: 55000 for one it did
-- not, and the statement ends - none of its keys is completed.
BEGIN;
SELECT outcome FROM idempotency.claim_batch(ARRAY['batch-c-1', 'batch-c-2'], NULL);
SAVEPOINT s;
SELECT idempotency.complete_batch(ARRAY['batch-c-1', 'batch-never-claimed'], ARRAY['1', '2']::jsonb[]);
ROLLBACK TO s;
SAVEPOINT s;
SELECT idempotency.complete_batch(ARRAY['batch-c-1', 'batch-c-1'], ARRAY['1', '2']::jsonb[]);
ROLLBACK TO s;
SELECT state FROM idempotency.lookup('batch-c-1');
SELECT idempotency.complete_batch(ARRAY['batch-c-2', 'batch-c-1'], ARRAY['2', '1']::jsonb[]);
COMMIT;
SELECT key, response FROM unnest(ARRAY['batch-c-1', 'batch-c-2']) AS key,
       LATERAL idempotency.lookup(key) ORDER BY key;

-- Other errors are not answers: a read-only transaction refuses to take a
-- new key (25006) and the statement ends; a batch of replays is answered.
BEGIN READ ONLY;
SELECT outcome, response FROM idempotency.claim_batch(ARRAY['batch-b-1', 'batch-b-3'], ARRAY['h1', 'h3']);
SELECT * FROM idempotency.claim_batch(ARRAY['batch-b-1', 'batch-read-only-new'], ARRAY['h1', NULL]);
ROLLBACK;

-- A transaction that commits with a key of a batch claimed and not
-- completed fails, as with claim().
BEGIN;
SELECT outcome FROM idempotency.claim_batch(ARRAY['batch-unfinished-1', 'batch-unfinished-2'], NULL);
SELECT idempotency.complete('batch-unfinished-1', '1');
COMMIT;
SELECT key, state FROM unnest(ARRAY['batch-unfinished-1', 'batch-unfinished-2']) AS key,
       LATERAL idempotency.lookup(key) ORDER BY key;

-- Keys of a batch are released one by one with release(); ROLLBACK TO a
-- savepoint before the batch lets go of all of them, locks and all.
BEGIN;
SAVEPOINT s;
SELECT outcome FROM idempotency.claim_batch(ARRAY['batch-sp-1', 'batch-sp-2'], NULL);
SELECT * FROM batch.claim_locks;
ROLLBACK TO s;
SELECT * FROM batch.claim_locks;
SELECT outcome FROM idempotency.claim_batch(ARRAY['batch-sp-1', 'batch-sp-2'], NULL);
SELECT idempotency.release('batch-sp-1');
SELECT idempotency.complete('batch-sp-2', '"kept"');
COMMIT;
SELECT key, state FROM unnest(ARRAY['batch-sp-1', 'batch-sp-2']) AS key,
       LATERAL idempotency.lookup(key) ORDER BY key;

-- Keys belong to the role that claims them: another role's batch of the
-- same key texts claims its own keys.
CREATE ROLE regress_batch_other;
GRANT USAGE ON SCHEMA batch TO regress_batch_other;
SET ROLE regress_batch_other;
BEGIN;
SELECT ordinality, outcome FROM idempotency.claim_batch(ARRAY['batch-b-1', 'batch-b-2'], ARRAY['h1', 'other']);
SELECT idempotency.complete_batch(ARRAY['batch-b-1', 'batch-b-2'], ARRAY['"mine"', '"mine"']::jsonb[]);
COMMIT;
SELECT outcome, response FROM idempotency.claim_batch(ARRAY['batch-b-1', 'batch-b-2'], ARRAY['h1', 'other']);
RESET ROLE;
SELECT outcome, response FROM idempotency.claim_batch(ARRAY['batch-b-1', 'batch-b-2'], ARRAY['h1', 'h2']);

-- Both functions run with the caller's rights, their names schema-qualified.
SELECT p.proname, p.prosecdef, p.provolatile, pg_get_function_identity_arguments(p.oid)
  FROM pg_proc AS p
 WHERE p.pronamespace = 'idempotency'::regnamespace
   AND p.proname IN ('claim_batch', 'complete_batch')
 ORDER BY p.proname;

-- The answers count as their single-key counterparts do.
SELECT idempotency.stats_reset();
SELECT outcome FROM idempotency.claim_batch(ARRAY['batch-b-1', 'batch-b-2'], ARRAY['h1', 'other']);
SELECT replays, conflicts, mismatches FROM idempotency.stats WHERE datname = current_database();

DELETE FROM idempotency.keys WHERE key LIKE 'batch-%';
-- A role that has keys is dropped after DROP OWNED BY, which deletes them.
DROP OWNED BY regress_batch_other;
DROP ROLE regress_batch_other;
