-- The application API: claim a key in the handler's transaction, do the work
-- in application code, complete it with the response.

\i sql/include/setup.sql
-- Keys past their TTL without tombstones (idempotency.remember = 0);
-- tombstones.sql tests them with.
SET idempotency.remember = 0;

-- Before any call of this session, last_call() has no row.
SELECT count(*) AS last_call_rows FROM idempotency.last_call();

-- This file's keys are the ones stored from now on.
CREATE TEMP TABLE app_started AS SELECT clock_timestamp() AS at;

CREATE TABLE app_orders (id serial PRIMARY KEY, key text NOT NULL, amount int NOT NULL);

-- An error raised by COMMIT or PREPARE as its SQLSTATE (psql shows it).
\set VERBOSITY sqlstate

-- Claim locks this backend holds.
CREATE VIEW app_claim_locks AS
  SELECT count(*) AS claim_locks FROM pg_locks
   WHERE pid = pg_backend_pid() AND locktype = 'advisory' AND objsubid < 0;

-- proceed: the transaction holds the key; nothing is stored yet.
BEGIN;
SELECT * FROM idempotency.claim('order-1', 'body-1');
SELECT * FROM idempotency.last_call();
SELECT idempotency.last_call_replayed();
SELECT state, created_at, response FROM idempotency.lookup('order-1');
SELECT * FROM app_claim_locks;
INSERT INTO app_orders (key, amount) VALUES ('order-1', 300);
INSERT INTO app_orders (key, amount) VALUES ('order-1', 5);
SELECT idempotency.complete('order-1', '{"order": 1, "total": 305}');
-- Completed outside any savepoint: the row covers the key, the lock is gone.
SELECT * FROM app_claim_locks;
SELECT state, response FROM idempotency.lookup('order-1');
COMMIT;

-- replay: the stored response with its times; the work does not run again.
SELECT replayed, response, expires_at - created_at AS ttl,
       created_at = (SELECT created_at FROM idempotency.keys WHERE key = 'order-1') AS created_at_is_stored
  FROM idempotency.claim('order-1', 'body-1');
SELECT outcome, expires_at - created_at AS ttl FROM idempotency.last_call();
SELECT idempotency.last_call_replayed();
SELECT state, expires_at - created_at AS ttl, response FROM idempotency.lookup('order-1');
SELECT count(*) AS order_rows FROM app_orders WHERE key = 'order-1';

-- The same key with another body: IK422. A failed call leaves no last_call.
SELECT sqlstate_of($$SELECT * FROM idempotency.claim('order-1', 'body-2')$$);
SELECT sqlstate_of($$SELECT * FROM idempotency.claim('order-1', NULL)$$);
SELECT count(*) AS last_call_rows FROM idempotency.last_call();

-- A NULL request_hash matches a NULL request_hash.
BEGIN;
SELECT replayed FROM idempotency.claim('order-nohash', NULL);
SELECT idempotency.complete('order-nohash', '"ok"');
COMMIT;
SELECT replayed, response FROM idempotency.claim('order-nohash', NULL);
SELECT sqlstate_of($$SELECT * FROM idempotency.claim('order-nohash', 'body')$$);

-- A stored SQL NULL response replays as NULL.
BEGIN;
SELECT replayed FROM idempotency.claim('order-null', 'b');
SELECT idempotency.complete('order-null', NULL);
COMMIT;
SELECT replayed, response IS NULL AS response_is_null FROM idempotency.claim('order-null', 'b');

-- One key table, one set of rules: a key taken through one API is another
-- request for the other (IK422), and the claim sees its row.
SELECT idempotency.idempotent_call('by-call', 'b', 'SELECT 1');
SELECT sqlstate_of($$SELECT * FROM idempotency.claim('by-call', 'b')$$);
SELECT sqlstate_of($$SELECT idempotency.idempotent_call('order-1', 'body-1', 'SELECT 1')$$);
SELECT sqlstate_of($$SELECT idempotency.idempotent_call('order-1', NULL, 'SELECT 1')$$);

-- complete and release need a key this transaction claimed and has not
-- completed: 55000 otherwise.
SELECT sqlstate_of($$SELECT idempotency.complete('never-claimed', '1')$$);
SELECT sqlstate_of($$SELECT idempotency.release('never-claimed')$$);
SELECT sqlstate_of($$SELECT idempotency.complete('order-1', '1')$$);
BEGIN;
SELECT replayed FROM idempotency.claim('twice', NULL);
SELECT idempotency.complete('twice', '1');
SAVEPOINT s;
SELECT sqlstate_of($$SELECT idempotency.complete('twice', '2')$$);
ROLLBACK TO s;
SAVEPOINT s;
SELECT sqlstate_of($$SELECT idempotency.release('twice')$$);
ROLLBACK TO s;
-- A claim of a key this transaction completed replays its own response.
SELECT replayed, response FROM idempotency.claim('twice', NULL);
COMMIT;
SELECT response FROM idempotency.lookup('twice');

-- A second claim of a key this transaction holds, unfinished, and an
-- idempotent_call of it: IK508.
BEGIN;
SELECT replayed FROM idempotency.claim('held', NULL);
SAVEPOINT s;
SELECT sqlstate_of($$SELECT * FROM idempotency.claim('held', NULL)$$);
SELECT sqlstate_of($$SELECT idempotency.idempotent_call('held', NULL, 'SELECT 1')$$);
ROLLBACK TO s;
SELECT idempotency.release('held');
COMMIT;

-- A transaction that commits holding an unfinished claim fails: nothing of
-- it commits.
BEGIN;
SELECT replayed FROM idempotency.claim('unfinished', NULL);
INSERT INTO app_orders (key, amount) VALUES ('unfinished', 1);
COMMIT;
SELECT count(*) AS order_rows FROM app_orders WHERE key = 'unfinished';
SELECT state FROM idempotency.lookup('unfinished');
-- Alone in an implicit transaction, a claim cannot commit either.
SELECT replayed FROM idempotency.claim('unfinished', NULL);
SELECT state FROM idempotency.lookup('unfinished');
-- Nor can it be prepared.
BEGIN;
SELECT replayed FROM idempotency.claim('unfinished', NULL);
PREPARE TRANSACTION 'app-unfinished';
SELECT count(*) AS prepared FROM pg_prepared_xacts WHERE gid = 'app-unfinished';

-- A completed key can be prepared; it commits with COMMIT PREPARED, even
-- when it was completed inside a savepoint (its lock goes with the prepared
-- transaction).
BEGIN;
SELECT replayed FROM idempotency.claim('prepared', NULL);
SAVEPOINT s;
SELECT idempotency.complete('prepared', '"prepared"');
RELEASE s;
PREPARE TRANSACTION 'app-prepared';
SELECT state FROM idempotency.lookup('prepared');
COMMIT PREPARED 'app-prepared';
SELECT replayed, response FROM idempotency.claim('prepared', NULL);
SELECT * FROM app_claim_locks;

-- release lets go of a claim: the work commits, the key stays absent, its
-- lock is gone, and a later claim proceeds.
BEGIN;
SELECT replayed FROM idempotency.claim('released', NULL);
INSERT INTO app_orders (key, amount) VALUES ('released', 7);
SELECT idempotency.release('released');
SELECT * FROM app_claim_locks;
SELECT state FROM idempotency.lookup('released');
SELECT sqlstate_of($$SELECT idempotency.complete('released', '1')$$);
COMMIT;
SELECT count(*) AS order_rows FROM app_orders WHERE key = 'released';
BEGIN;
SELECT replayed FROM idempotency.claim('released', NULL);
SELECT idempotency.complete('released', '"second"');
COMMIT;
SELECT response FROM idempotency.lookup('released');

-- Savepoints. A claim taken after a savepoint goes with ROLLBACK TO, lock
-- and all, and the transaction commits.
BEGIN;
SAVEPOINT s;
SELECT replayed FROM idempotency.claim('sp-claim', NULL);
SELECT * FROM app_claim_locks;
ROLLBACK TO s;
SELECT * FROM app_claim_locks;
SELECT state FROM idempotency.lookup('sp-claim');
COMMIT;
SELECT state FROM idempotency.lookup('sp-claim');

-- Claimed before the savepoint, completed after it: ROLLBACK TO leaves the
-- key claimed, not completed, and COMMIT fails.
BEGIN;
SELECT replayed FROM idempotency.claim('sp-complete', NULL);
SAVEPOINT s;
SELECT idempotency.complete('sp-complete', '"lost"');
-- Completed inside a savepoint: the lock stays, as ROLLBACK TO may follow.
SELECT * FROM app_claim_locks;
ROLLBACK TO s;
SELECT * FROM app_claim_locks;
SELECT state FROM idempotency.lookup('sp-complete');
COMMIT;
SELECT state FROM idempotency.lookup('sp-complete');

-- ... and completing it again after the ROLLBACK TO stores that response.
BEGIN;
SELECT replayed FROM idempotency.claim('sp-complete', NULL);
SAVEPOINT s;
SELECT idempotency.complete('sp-complete', '"lost"');
ROLLBACK TO s;
SELECT idempotency.complete('sp-complete', '"kept"');
COMMIT;
SELECT replayed, response FROM idempotency.claim('sp-complete', NULL);

-- Claimed and completed inside savepoints that are released: kept.
BEGIN;
SAVEPOINT a;
SELECT replayed FROM idempotency.claim('sp-released', NULL);
SAVEPOINT b;
SELECT idempotency.complete('sp-released', '"nested"');
RELEASE b;
RELEASE a;
COMMIT;
SELECT response FROM idempotency.lookup('sp-released');

-- Claimed in a savepoint that is released, completed in the parent.
BEGIN;
SAVEPOINT a;
SELECT replayed FROM idempotency.claim('sp-parent', NULL);
RELEASE a;
SELECT idempotency.complete('sp-parent', '"parent"');
SELECT * FROM app_claim_locks;
COMMIT;
SELECT response FROM idempotency.lookup('sp-parent');

-- A released savepoint's claim still goes when an outer savepoint rolls
-- back.
BEGIN;
SAVEPOINT a;
SAVEPOINT b;
SELECT replayed FROM idempotency.claim('sp-outer', NULL);
RELEASE b;
ROLLBACK TO a;
SELECT * FROM app_claim_locks;
COMMIT;
SELECT state FROM idempotency.lookup('sp-outer');

-- release is not undone by ROLLBACK TO: the key is let go at once.
BEGIN;
SELECT replayed FROM idempotency.claim('sp-release', NULL);
SAVEPOINT s;
SELECT idempotency.release('sp-release');
ROLLBACK TO s;
SELECT sqlstate_of($$SELECT idempotency.complete('sp-release', '1')$$);
COMMIT;

-- A key's TTL is the idempotency.ttl in force when it is claimed.
BEGIN;
SET LOCAL idempotency.ttl = '1h';
SELECT replayed FROM idempotency.claim('ttl-1h', NULL);
SET LOCAL idempotency.ttl = '5h';
SELECT idempotency.complete('ttl-1h', '1');
COMMIT;
SELECT state, expires_at - created_at AS ttl FROM idempotency.lookup('ttl-1h');

-- An expired key looks expired, and a claim takes it anew.
SET idempotency.ttl = '1h';
BEGIN;
SELECT replayed FROM idempotency.claim('expiring', 'b');
SELECT idempotency.complete('expiring', '"old"');
COMMIT;
RESET idempotency.ttl;
-- The key expired a second ago.
UPDATE idempotency.keys
   SET created_at = created_at - (expires_at - now()) - interval '1 second',
       expires_at = now() - interval '1 second'
 WHERE key = 'expiring';
SELECT state, response, expires_at - created_at AS ttl FROM idempotency.lookup('expiring');
SELECT idempotency.forget('expiring');
BEGIN;
SELECT replayed, response FROM idempotency.claim('expiring', 'other body');
SELECT state FROM idempotency.lookup('expiring');
SELECT idempotency.complete('expiring', '"new"');
COMMIT;
SELECT replayed, response FROM idempotency.claim('expiring', 'other body');
SELECT count(*) AS rows_for_key FROM idempotency.keys WHERE key = 'expiring';

-- forget: the owner deletes its own done key; false when there is none; a
-- key this transaction holds cannot be forgotten.
SELECT idempotency.forget('order-null');
SELECT state FROM idempotency.lookup('order-null');
SELECT idempotency.forget('order-null');
SELECT idempotency.forget('never-claimed');
BEGIN;
SELECT replayed FROM idempotency.claim('order-null', 'b');
SELECT sqlstate_of($$SELECT idempotency.forget('order-null')$$);
SELECT idempotency.complete('order-null', '"again"');
COMMIT;
SELECT response FROM idempotency.lookup('order-null');

-- Keys are per role: another role sees none of them, cannot forget them, and
-- its own key of the same text is another key.
CREATE ROLE app_other;
GRANT SELECT, INSERT ON app_orders TO app_other;
SET ROLE app_other;
SELECT state FROM idempotency.lookup('order-1');
SELECT idempotency.forget('order-1');
BEGIN;
SELECT replayed FROM idempotency.claim('order-1', 'body-1');
SELECT sqlstate_of($$SELECT idempotency.complete('never', '1')$$);
SELECT idempotency.complete('order-1', '"other role"');
COMMIT;
SELECT response FROM idempotency.lookup('order-1');
RESET ROLE;
SELECT response FROM idempotency.lookup('order-1');
-- A role that claimed cannot complete after SET ROLE: the key is the
-- claiming role's.
BEGIN;
SELECT replayed FROM idempotency.claim('role-switch', NULL);
SET LOCAL ROLE app_other;
SELECT sqlstate_of($$SELECT idempotency.complete('role-switch', '1')$$);
RESET ROLE;
SELECT idempotency.release('role-switch');
COMMIT;
DELETE FROM idempotency.keys WHERE scope::text = 'app_other';
REVOKE ALL ON app_orders FROM app_other;
-- A role that has keys is dropped after DROP OWNED BY, which deletes them.
DROP OWNED BY app_other;
DROP ROLE app_other;

-- Keys are checked as idempotent_call checks them.
SELECT sqlstate_of($$SELECT * FROM idempotency.claim(NULL, 'b')$$);
SELECT sqlstate_of($$SELECT * FROM idempotency.claim('', 'b')$$);
SELECT sqlstate_of($$SELECT * FROM idempotency.claim(repeat('k', 256), 'b')$$);
SELECT sqlstate_of($$SELECT idempotency.complete(NULL, '1')$$);
SELECT sqlstate_of($$SELECT idempotency.release('')$$);
SELECT sqlstate_of($$SELECT * FROM idempotency.lookup(NULL)$$);
SELECT sqlstate_of($$SELECT idempotency.forget(repeat('k', 256))$$);

-- A claim that must write cannot run in a read-only transaction; a replay
-- and a lookup can.
BEGIN READ ONLY;
SELECT sqlstate_of($$SELECT * FROM idempotency.claim('read-only', NULL)$$);
SELECT replayed, response FROM idempotency.claim('order-1', 'body-1');
SELECT state FROM idempotency.lookup('order-1');
SELECT sqlstate_of($$SELECT idempotency.forget('order-1')$$);
COMMIT;

DROP VIEW app_claim_locks;
DROP TABLE app_orders;
DELETE FROM idempotency.keys WHERE created_at >= (SELECT at FROM app_started);
