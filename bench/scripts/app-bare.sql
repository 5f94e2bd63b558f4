-- the application's work alone, in the transaction a handler opens: no
-- idempotency (3 round trips)
\set account random(1, :accounts)
BEGIN;
SELECT bench.withdraw(:account::int, 1::bigint) AS response \gset
COMMIT;
