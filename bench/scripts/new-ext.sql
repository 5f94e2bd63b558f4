-- new keys through the extension; random UUIDs as keys, as clients send
\set account random(1, :accounts)
SELECT idempotency.idempotent_call(gen_random_uuid()::text, NULL, 'SELECT bench.withdraw($1, $2)', :account::int, 1::bigint);
