-- the textbook protocol done by hand from the client, new key: claim the key
-- row with INSERT ... ON CONFLICT DO NOTHING, do the work, store the
-- response with UPDATE, commit (5 round trips)
\set account random(1, :accounts)
\set key random(1, 9223372036854775807)
BEGIN;
INSERT INTO bench.keys (key, request_hash, status) VALUES (:key, 'request', 'in_progress') ON CONFLICT (key) DO NOTHING;
SELECT bench.withdraw(:account::int, 1::bigint) AS response \gset
UPDATE bench.keys SET status = 'done', response = :response WHERE key = :key;
COMMIT;
