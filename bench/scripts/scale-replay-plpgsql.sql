-- bench/scale: replays through the textbook protocol of keys picked at
-- random over the whole filled table (keys 1..:keys, bench.scale_key(i));
-- every one was stored for the request account 1, amount 1
\set i random(1, :keys)
SELECT bench.idempotent_withdraw(bench.scale_key(:i), 1, 1::bigint);
