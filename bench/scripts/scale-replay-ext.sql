-- bench/scale: replays through the extension of keys picked at random over
-- the whole filled table (keys 1..:keys, bench.scale_key(i)); every one was
-- stored for the request of the template call (account 1, amount 1)
\set i random(1, :keys)
SELECT idempotency.idempotent_call(bench.scale_key(:i), NULL, 'SELECT bench.withdraw($1, $2)', 1, 1::bigint);
