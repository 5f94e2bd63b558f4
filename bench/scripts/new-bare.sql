-- new keys, no idempotency: the business operation alone
\set account random(1, :accounts)
SELECT bench.withdraw(:account::int, 1::bigint);
