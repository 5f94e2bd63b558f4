-- What a key's stored fingerprint covers. A client's own request_hash is
-- stored framed with fn (idempotent_call) or with a claim marker (claim), so
-- the same key and hash with another fn, or through the other API, is
-- another request (IK422). Fingerprints of the forms before 0.6 (the
-- SHA-256 of a client's text, as the update to 0.4 turned the text 0.1
-- and 0.2 stored) are no longer matched.
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

-- A row whose fingerprint has the form 0.1 and 0.2 gave a client's hash
-- (its text; the update to 0.4 made it the text's SHA-256), as a dump of
-- 0.4 or 0.5 loads it: the same delivery no longer matches it and answers
-- IK422 (docs/fingerprints.md); fn does not run.
INSERT INTO idempotency.keys (scope, key, request_hash, response, created_at, expires_at)
VALUES (current_user::text::idempotency.role_scope, 'fp-legacy', sha256(convert_to('client-hash', 'UTF8')),
        '{"stored": "by 0.2"}', now(), now() + interval '1 day');
SELECT sqlstate_of($$SELECT idempotency.idempotent_call('fp-legacy', 'client-hash', 'SELECT 1')$$) AS legacy_client_text;
SELECT sqlstate_of($$SELECT * FROM idempotency.claim('fp-legacy', 'client-hash')$$) AS legacy_claim;
SELECT response FROM idempotency.keys WHERE key = 'fp-legacy';

DELETE FROM idempotency.keys WHERE key LIKE 'fp-%';
