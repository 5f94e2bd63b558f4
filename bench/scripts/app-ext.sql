-- the application API, new key: claim, do the work, complete, commit
-- (5 round trips)
\set account random(1, :accounts)
\set key random(1, 9223372036854775807)
BEGIN;
SELECT replayed FROM idempotency.claim(:key, 'request') \gset
SELECT bench.withdraw(:account::int, 1::bigint) AS response \gset
SELECT idempotency.complete(:key, :response);
COMMIT;
