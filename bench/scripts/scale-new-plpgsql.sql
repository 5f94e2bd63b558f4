-- bench/scale: new keys through the textbook PL/pgSQL protocol, shaped as
-- the table's keys (bench.scale_new_key(), defined per key shape)
\set account random(1, :accounts)
SELECT bench.idempotent_withdraw(bench.scale_new_key(), :account::int, 1::bigint);
