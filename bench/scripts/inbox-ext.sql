-- a new message through the queue consumers' extension path
-- (packages/node's consume(); idempotency_pg.consumer sends the same but
-- selects the answer in a third statement after COMMIT), statement for
-- statement: BEGIN with the claim, the work, complete (the answer sent as a
-- literal and selected back as jsonb, as the consumers send it) with COMMIT
\set account random(1, :accounts)
\set key random(1, 9223372036854775807)
BEGIN;
SELECT idempotency.claim(:key::text, '0b7a2cbbd0d5a3d1ea0b3bb5a8d6a1c4e0c9f3b7a2d6e1f0c3b9a8d7e6f5a4b3') AS claimed;
SELECT bench.withdraw(:account::int, 1::bigint);
SELECT idempotency.complete(:key::text, answer), answer AS text FROM CAST('{"ok": true, "entry": 123456, "account": 4321, "balance": 999999999999}' AS jsonb) AS answer;
COMMIT;
