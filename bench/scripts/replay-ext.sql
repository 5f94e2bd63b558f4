-- replays of stored keys r1..rN through the extension
\set i random(1, :replay_keys)
\set account 1 + :i % :accounts
SELECT idempotency.idempotent_call('r' || :i::int, NULL, 'SELECT bench.withdraw($1, $2)', :account::int, 1::bigint);
