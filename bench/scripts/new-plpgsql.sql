-- new keys, textbook PL/pgSQL protocol; random UUIDs as keys, as clients send
\set account random(1, :accounts)
SELECT bench.idempotent_withdraw(gen_random_uuid()::text, :account::int, 1::bigint);
