-- A key's TTL counts from the moment its row is written, not from the start
-- of its transaction, and a transaction never commits a key that has
-- already expired: the commit fails with 40001 and nothing is stored.
SET client_min_messages = warning;
CREATE EXTENSION IF NOT EXISTS idempotency;
RESET client_min_messages;
CREATE FUNCTION stored(k text) RETURNS bigint LANGUAGE sql
  AS $$ SELECT count(*) FROM idempotency.keys WHERE key = k $$;

-- Work that outlasts the TTL before the call: the key is still live when
-- the transaction commits, and a retry replays it.
BEGIN;
SET LOCAL idempotency.ttl = '2s';
SELECT now() AS transaction_start \gset
SELECT pg_sleep(2.2);
SELECT idempotency.idempotent_call('ttl-long-work', NULL, 'SELECT 1');
COMMIT;
SELECT created_at - :'transaction_start'::timestamptz >= interval '2.2 seconds' AS counted_from_write,
       expires_at - created_at AS ttl
  FROM idempotency.keys WHERE key = 'ttl-long-work';
SELECT idempotency.idempotent_call('ttl-long-work', NULL, 'SELECT 1'),
       idempotency.last_call_replayed();

-- Work that outlasts the TTL after the call: the commit is refused.
BEGIN;
SET LOCAL idempotency.ttl = '100 milliseconds';
SELECT idempotency.idempotent_call('ttl-expired-at-commit', NULL, 'SELECT 2');
SELECT pg_sleep(0.2);
\set VERBOSITY terse
COMMIT;
\set VERBOSITY default
SELECT stored('ttl-expired-at-commit');

-- The same for PREPARE TRANSACTION.
BEGIN;
SET LOCAL idempotency.ttl = '100 milliseconds';
SELECT idempotency.idempotent_call('ttl-expired-at-prepare', NULL, 'SELECT 3');
SELECT pg_sleep(0.2);
\set VERBOSITY terse
PREPARE TRANSACTION 'store_ttl_expired';
\set VERBOSITY default
SELECT count(*) AS prepared FROM pg_prepared_xacts WHERE gid = 'store_ttl_expired';
SELECT stored('ttl-expired-at-prepare');

-- A key written in a subtransaction that rolled back is gone with it and
-- does not hold the commit back; one in a released savepoint does.
BEGIN;
SET LOCAL idempotency.ttl = '100 milliseconds';
SAVEPOINT s;
SELECT idempotency.idempotent_call('ttl-rolled-back', NULL, 'SELECT 4');
ROLLBACK TO SAVEPOINT s;
SELECT pg_sleep(0.2);
COMMIT;
BEGIN;
SET LOCAL idempotency.ttl = '100 milliseconds';
SAVEPOINT s;
SELECT idempotency.idempotent_call('ttl-released', NULL, 'SELECT 5');
RELEASE SAVEPOINT s;
SELECT pg_sleep(0.2);
\set VERBOSITY terse
COMMIT;
\set VERBOSITY default
SELECT stored('ttl-rolled-back'), stored('ttl-released');

-- A released savepoint's key is its parent's: a later savepoint rolled back
-- at the same depth does not take it.
BEGIN;
SET LOCAL idempotency.ttl = '100 milliseconds';
SAVEPOINT s;
SELECT idempotency.idempotent_call('ttl-released-then-rolled-back', NULL, 'SELECT 6');
RELEASE SAVEPOINT s;
SAVEPOINT t;
ROLLBACK TO SAVEPOINT t;
SELECT pg_sleep(0.2);
\set VERBOSITY terse
COMMIT;
\set VERBOSITY default
SELECT stored('ttl-released-then-rolled-back');

-- The refusal ends with its transaction: the next one commits.
SELECT idempotency.idempotent_call('ttl-expired-at-commit', NULL, 'SELECT 2'),
       idempotency.last_call_replayed();
SELECT stored('ttl-expired-at-commit');

DROP FUNCTION stored(text);
