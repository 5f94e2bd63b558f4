-- bench/scale: new keys through the extension, shaped as the table's keys
-- (bench.scale_new_key(), defined per key shape by bench/scale)
\set account random(1, :accounts)
SELECT idempotency.idempotent_call(bench.scale_new_key(), NULL, 'SELECT bench.withdraw($1, $2)', :account::int, 1::bigint);
