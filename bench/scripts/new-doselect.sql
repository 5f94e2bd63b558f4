-- new keys, textbook protocol on INSERT ... ON CONFLICT DO SELECT (PostgreSQL 19)
\set account random(1, :accounts)
SELECT bench.idempotent_withdraw_doselect(gen_random_uuid()::text, :account::int, 1::bigint);
