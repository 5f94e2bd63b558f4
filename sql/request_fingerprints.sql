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

-- The stored fingerprint is a SHA-256 digest (32 bytes), never the
-- client's text.
SELECT key, octet_length(request_hash) AS hash_bytes,
       request_hash <> convert_to('client-hash', 'UTF8') AS not_client_text
  FROM idempotency.keys WHERE key IN ('fp-1', 'fp-2') ORDER BY key;
-- fn and the client's hash together decide it, one framing for all.
SELECT (SELECT request_hash FROM idempotency.keys WHERE key = 'fp-1')
     = (SELECT request_hash FROM idempotency.keys WHERE key = 'fp-2') AS different_fn_same_hash;

-- The fingerprint computed for a NULL request_hash is what it always was:
-- SHA-256 over fn and the arguments' types and values (pinned here: the
-- digest of the frames 01 'SELECT $1', 04 'integer', 05 int4send(300)).
SELECT idempotency.idempotent_call('fp-null', NULL, 'SELECT $1', 300);
SELECT encode(request_hash, 'hex') AS request_hash FROM idempotency.keys WHERE key = 'fp-null';

-- A claim's fingerprint is marked as a claim: the same key and hash through
-- idempotent_call is another request, both ways.
BEGIN;
SELECT replayed FROM idempotency.claim('fp-claim', 'client-hash');
SELECT idempotency.complete('fp-claim', '1');
COMMIT;
SELECT sqlstate_of($$SELECT idempotency.idempotent_call('fp-claim', 'client-hash', 'SELECT 1')$$);
SELECT sqlstate_of($$SELECT * FROM idempotency.claim('fp-1', 'client-hash')$$);
SELECT octet_length(request_hash) AS hash_bytes,
       request_hash <> convert_to('client-hash', 'UTF8') AS not_client_text
  FROM idempotency.keys WHERE key = 'fp-claim';

-- Keys stored by 0.2 and 0.3 keep replaying after the update to 0.4, which
-- stores fingerprints as 32 raw bytes. A database with the extension at 0.2
-- and key rows as 0.2 wrote them (the client's hash as given: any text, or
-- one that happens to spell a hex digest); then 0.3 and a row as 0.3 wrote
-- it (the hex digest of fn 'SELECT $1' and the integer 300, pinned above as
-- fp-null); then the update to the current version.
SELECT current_database() AS home_database \gset
CREATE DATABASE fp_upgrade;
\c fp_upgrade
CREATE EXTENSION idempotency VERSION '0.2';
\i sql/include/setup.sql
INSERT INTO idempotency.keys (scope, key, request_hash, response, created_at, expires_at)
VALUES (current_user::regrole, 'legacy', 'client-hash', '{"stored": "by 0.2"}', now(), now() + interval '1 day'),
       (current_user::regrole, 'legacy-hex', repeat('ab', 32), '{"stored": "by 0.2, hex"}', now(), now() + interval '1 day');
ALTER EXTENSION idempotency UPDATE TO '0.3';
INSERT INTO idempotency.keys (scope, key, request_hash, response, created_at, expires_at)
VALUES (current_user::text::idempotency.role_scope, 'by-0.3', '291ad078b9cf139443159be6ee1e816ac9ba37a490e6160b330ba82f2413efda',
        '{"stored": "by 0.3"}', now(), now() + interval '1 day');
ALTER EXTENSION idempotency UPDATE;
SELECT extversion FROM pg_extension WHERE extname = 'idempotency';
-- The same deliveries replay; a different client hash is still IK422.
SELECT idempotency.idempotent_call('legacy', 'client-hash', 'SELECT 1'), idempotency.last_call_replayed();
SELECT idempotency.idempotent_call('legacy-hex', repeat('ab', 32), 'SELECT 1'), idempotency.last_call_replayed();
SELECT idempotency.idempotent_call('by-0.3', NULL, 'SELECT $1', 300), idempotency.last_call_replayed();
SELECT sqlstate_of($$SELECT idempotency.idempotent_call('legacy', 'other-hash', 'SELECT 1')$$);
SELECT sqlstate_of($$SELECT idempotency.idempotent_call('legacy-hex', repeat('cd', 32), 'SELECT 1')$$);
SELECT sqlstate_of($$SELECT idempotency.idempotent_call('by-0.3', NULL, 'SELECT $1', 301)$$);
-- A NULL request_hash never matched a client's text, and still does not.
SELECT sqlstate_of($$SELECT idempotency.idempotent_call('legacy', NULL, 'SELECT 1')$$);
-- Nor does a claim with the same text: 0.2 had no claim.
SELECT sqlstate_of($$SELECT * FROM idempotency.claim('legacy', 'client-hash')$$);
-- What the rows hold now: the legacy text's SHA-256, the bytes a hex text
-- spells, and the 0.3 digest as bytes; every key under its digest.
SELECT key, request_hash = CASE key
         WHEN 'legacy' THEN sha256(convert_to('client-hash', 'UTF8'))
         WHEN 'legacy-hex' THEN decode(repeat('ab', 32), 'hex')
         ELSE decode('291ad078b9cf139443159be6ee1e816ac9ba37a490e6160b330ba82f2413efda', 'hex')
       END AS converted,
       key_digest = idempotency.key_digest(key) AS digest_of_key
  FROM idempotency.keys ORDER BY key;
\c :home_database
DROP DATABASE fp_upgrade;

DELETE FROM idempotency.keys WHERE key LIKE 'fp-%';
