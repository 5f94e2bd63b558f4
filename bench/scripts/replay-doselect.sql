-- replays of stored keys r1..rN through the textbook protocol on ON CONFLICT DO SELECT (PostgreSQL 19)
\set i random(1, :replay_keys)
\set account 1 + :i % :accounts
SELECT bench.idempotent_withdraw_doselect('r' || :i::int, :account::int, 1::bigint);
