-- Expiry at exact instants, without waiting for a clock: a key is live
-- while expires_at is after the caller's transaction start (now()) and
-- expired from expires_at = now() on, for idempotent_call, claim() and
-- lookup() alike; expire() deletes a key whose expires_at is exactly its
-- cutoff (the transaction start, with no other transaction open) and keeps
-- one a microsecond later. Each transaction moves a stored key's
-- expires_at relative to now(), looks, and rolls back.
\i sql/include/setup.sql
-- Keys past their TTL without tombstones (idempotency.remember = 0);
-- tombstones.sql tests them with.
SET idempotency.remember = 0;
SELECT idempotency.expire() AS expired_before \gset

-- fn's result is the run number: a replay answers an old number, a run a
-- new one.
CREATE SEQUENCE instant_runs;
CREATE FUNCTION instant_call(key text, OUT response jsonb, OUT replayed boolean)
LANGUAGE plpgsql AS $$
BEGIN
  response := idempotency.idempotent_call(key, NULL, 'SELECT nextval(''instant_runs'')');
  replayed := idempotency.last_call_replayed();
END $$;
-- Puts a key's expiry `offset` after this transaction's start; answers
-- the offset as stored, so the output shows the instant exactly.
CREATE FUNCTION expire_in(k text, offset_ interval) RETURNS interval
LANGUAGE sql AS $$
  UPDATE idempotency.keys SET expires_at = now() + offset_
   WHERE key = k RETURNING expires_at - now()
$$;

SELECT * FROM instant_call('instant-call');

-- idempotent_call: replayed at its last live instant, run again one
-- microsecond later.
BEGIN;
SELECT expire_in('instant-call', '1 microsecond');
SELECT * FROM instant_call('instant-call');
ROLLBACK;
BEGIN;
SELECT expire_in('instant-call', '0');
SELECT * FROM instant_call('instant-call');
ROLLBACK;

-- claim(): the stored response at the last live instant; the key to take
-- again one microsecond later.
BEGIN;
SELECT replayed FROM idempotency.claim('instant-claim', NULL);
SELECT idempotency.complete('instant-claim', '"first"');
COMMIT;
BEGIN;
SELECT expire_in('instant-claim', '1 microsecond');
SELECT replayed, response FROM idempotency.claim('instant-claim', NULL);
ROLLBACK;
BEGIN;
SELECT expire_in('instant-claim', '0');
SELECT replayed, response FROM idempotency.claim('instant-claim', NULL);
SELECT idempotency.complete('instant-claim', '"second"');
SELECT replayed, response FROM idempotency.claim('instant-claim', NULL);
ROLLBACK;

-- lookup(): done at the last live instant, expired one microsecond later.
BEGIN;
SELECT expire_in('instant-claim', '1 microsecond');
SELECT state, response FROM idempotency.lookup('instant-claim');
SELECT expire_in('instant-claim', '0');
SELECT state, expires_at = now() AS expires_now, response
  FROM idempotency.lookup('instant-claim');
ROLLBACK;

-- expire(): the key at its cutoff goes, the one a microsecond after stays.
-- No other transaction of this database is open, so the cutoff is now().
SELECT * FROM instant_call('instant-at-cutoff');
SELECT * FROM instant_call('instant-after-cutoff');
BEGIN;
SELECT expire_in('instant-at-cutoff', '0');
SELECT expire_in('instant-after-cutoff', '1 microsecond');
SELECT idempotency.expire() >= 1 AS deleted_some;
SELECT key FROM idempotency.keys WHERE key LIKE 'instant-%cutoff' ORDER BY key;
-- The key kept is still live for a caller: it replays.
SELECT * FROM instant_call('instant-after-cutoff');
ROLLBACK;
SELECT key FROM idempotency.keys WHERE key LIKE 'instant-%' ORDER BY key;
DELETE FROM idempotency.keys WHERE key LIKE 'instant-%';

DROP FUNCTION instant_call(text);
DROP FUNCTION expire_in(text, interval);
DROP SEQUENCE instant_runs;
