-- a redelivered message through the queue consumers' extension path: its
-- claim replays (20 keys, each stored by its first call, in the warm-up),
-- and nothing else runs before COMMIT
\set key random(1, 20)
BEGIN;
SELECT idempotency.claim('redelivered-' || :key, '0b7a2cbbd0d5a3d1ea0b3bb5a8d6a1c4e0c9f3b7a2d6e1f0c3b9a8d7e6f5a4b3') AS claimed;
SELECT idempotency.complete('redelivered-' || :key, '{"ok": true}'::jsonb) WHERE NOT idempotency.last_call_replayed();
COMMIT;
