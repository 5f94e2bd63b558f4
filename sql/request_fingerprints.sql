-- What a key's stored fingerprint covers. A client's own request_hash is
-- stored framed with fn (idempotent_call) or with a claim marker (claim), so
-- the same key and hash with another fn, or through the other API, is
-- another request (IK422). Keys stored by 0.2 hold the client's text as
-- given and keep replaying after ALTER EXTENSION UPDATE.
\i sql/include/setup.sql

-- Same key, same client hash, another fn: IK422, with or without arguments.
SELECT idempotency.idempotent_call('fp-1', 'client-hash', 'SELECT 1');
SELECT idempotency.idempotent_call('fp-1', 'client-hash', 'SELECT 1'), idempotency.last_call_replayed();
SELECT sqlstate_of($$SELECT idempotency.idempotent_call('fp-1', 'client-hash', 'SELECT 2')$$);
SELECT idempotency.idempotent_call('fp-2', 'client-hash', 'SELECT $1', 5);
SELECT idempotency.idempotent_call('fp-2', 'client-hash', 'SELECT $1', 6), idempotency.last_call_replayed();
SELECT sqlstate_of($$SELECT idempotency.idempotent_call('fp-2', 'client-hash', 'SELECT $1 + 0', 5)$$);

-- The stored fingerprint is a SHA-256 digest, never the client's text.
SELECT key, request_hash ~ '^[0-9a-f]{64}$' AS hash_is_hex,
       request_hash <> 'client-hash' AS not_client_text
  FROM idempotency.keys WHERE key IN ('fp-1', 'fp-2') ORDER BY key;
-- fn and the client's hash together decide it, one framing for all.
SELECT (SELECT request_hash FROM idempotency.keys WHERE key = 'fp-1')
     = (SELECT request_hash FROM idempotency.keys WHERE key = 'fp-2') AS different_fn_same_hash;

-- The fingerprint computed for a NULL request_hash is what it always was:
-- SHA-256 over fn and the arguments' types and values (pinned here: the
-- digest of the frames 01 'SELECT $1', 04 'integer', 05 int4send(300)).
SELECT idempotency.idempotent_call('fp-null', NULL, 'SELECT $1', 300);
SELECT request_hash FROM idempotency.keys WHERE key = 'fp-null';

-- A claim's fingerprint is marked as a claim: the same key and hash through
-- idempotent_call is another request, both ways.
BEGIN;
SELECT replayed FROM idempotency.claim('fp-claim', 'client-hash');
SELECT idempotency.complete('fp-claim', '1');
COMMIT;
SELECT sqlstate_of($$SELECT idempotency.idempotent_call('fp-claim', 'client-hash', 'SELECT 1')$$);
SELECT sqlstate_of($$SELECT * FROM idempotency.claim('fp-1', 'client-hash')$$);
SELECT request_hash ~ '^[0-9a-f]{64}$' AS hash_is_hex,
       request_hash <> 'client-hash' AS not_client_text
  FROM idempotency.keys WHERE key = 'fp-claim';

-- Keys stored by 0.2: a database with the extension at 0.2, a key row as
-- 0.2 wrote it (the client's hash as given), then the update.
SELECT current_database() AS home_database \gset
CREATE DATABASE fp_upgrade;
\c fp_upgrade
CREATE EXTENSION idempotency VERSION '0.2';
\i sql/include/setup.sql
INSERT INTO idempotency.keys (scope, key, request_hash, response, created_at, expires_at)
VALUES (current_user::regrole, 'legacy', 'client-hash', '{"stored": "by 0.2"}', now(), now() + interval '1 day');
ALTER EXTENSION idempotency UPDATE;
SELECT extversion FROM pg_extension WHERE extname = 'idempotency';
-- The same delivery replays; a different client hash is still IK422.
SELECT idempotency.idempotent_call('legacy', 'client-hash', 'SELECT 1'), idempotency.last_call_replayed();
SELECT sqlstate_of($$SELECT idempotency.idempotent_call('legacy', 'other-hash', 'SELECT 1')$$);
-- A NULL request_hash never matched a client's text, and still does not.
SELECT sqlstate_of($$SELECT idempotency.idempotent_call('legacy', NULL, 'SELECT 1')$$);
-- Nor does a claim with the same text: 0.2 had no claim.
SELECT sqlstate_of($$SELECT * FROM idempotency.claim('legacy', 'client-hash')$$);
-- The row is left as it was.
SELECT request_hash FROM idempotency.keys WHERE key = 'legacy';
\c :home_database
DROP DATABASE fp_upgrade;

DELETE FROM idempotency.keys WHERE key LIKE 'fp-%';
