-- replays of stored keys r1..rN through the extension, the arguments
-- untyped placeholders (the keys were stored with typed ones: one request)
\set i random(1, :replay_keys)
\set account 1 + :i % :accounts
\set amount 1
SELECT idempotency.idempotent_call('r' || :i, NULL, 'SELECT bench.withdraw($1, $2)', :account, :amount);
