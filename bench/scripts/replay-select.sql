-- the floor for replays: a primary-key SELECT of a stored response
\set i random(1, :replay_keys)
SELECT response FROM bench.keys WHERE key = 'r' || :i::int;
