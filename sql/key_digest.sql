-- The primary key holds (scope, key_digest): the first 11 bytes of SHA-256
-- over the key's UTF-8 bytes. The key's text stays in the row and every lookup
-- compares it, so a row whose digest belongs to another key is an error,
-- never another key's response.
\i sql/include/setup.sql

-- The digest is SHA-256's first 11 bytes, whatever the key's length.
SELECT idempotency.key_digest('k') = substring(sha256(convert_to('k', 'UTF8')) FOR 11) AS sha256_prefix,
       octet_length(idempotency.key_digest(repeat('x', 255))) AS long_key_bytes;

-- Every call stores it; a DBA finds a key through the primary key.
SELECT idempotency.idempotent_call('kd-1', NULL, 'SELECT 1');
SET enable_seqscan = off;
EXPLAIN (COSTS OFF)
SELECT key FROM idempotency.keys
 WHERE scope OPERATOR(idempotency.=) idempotency.current_scope()
   AND key_digest = idempotency.key_digest('kd-1');
SELECT key FROM idempotency.keys
 WHERE scope OPERATOR(idempotency.=) idempotency.current_scope()
   AND key_digest = idempotency.key_digest('kd-1');
RESET enable_seqscan;

-- A row whose key text was changed by hand still carries the old key's
-- digest. A call with the old key finds that row and refuses it (23505):
-- the row belongs to another key. Nothing runs, nothing is stored.
CREATE TABLE kd_runs (n int);
SELECT idempotency.idempotent_call('kd-2', NULL, 'INSERT INTO kd_runs VALUES (1) RETURNING n');
UPDATE idempotency.keys SET key = 'kd-2-edited' WHERE key = 'kd-2';
SELECT sqlstate_of($$SELECT idempotency.idempotent_call('kd-2', NULL, 'INSERT INTO kd_runs VALUES (2) RETURNING n')$$);
SELECT sqlstate_of($$SELECT * FROM idempotency.lookup('kd-2')$$);
SELECT count(*) AS runs FROM kd_runs;
-- The edited key is not found under its new text either: it has no row
-- with its own digest, so it runs.
SELECT idempotency.idempotent_call('kd-2-edited', NULL, 'INSERT INTO kd_runs VALUES (3) RETURNING n');
-- Restoring the digest of the row's key makes the row that key's again:
-- the request it stored replays.
DELETE FROM idempotency.keys WHERE key = 'kd-2-edited' AND response = '3';
UPDATE idempotency.keys SET key_digest = idempotency.key_digest(key) WHERE key = 'kd-2-edited';
SELECT idempotency.idempotent_call('kd-2-edited', NULL, 'INSERT INTO kd_runs VALUES (1) RETURNING n'),
       idempotency.last_call_replayed();
SELECT n FROM kd_runs ORDER BY n;

-- Rows loaded by COPY or INSERT get the digest of their key from the
-- trigger keys_loaded, whatever digest they carry (a dump of 0.4 to 0.6
-- carries another).
INSERT INTO idempotency.keys (scope, key, request_hash, response, created_at, expires_at, key_digest)
VALUES (current_user::text::idempotency.role_scope, 'kd-3', sha256('kd-3 request'), '"loaded"',
        now(), now() + interval '1 day', '\x0102');
SELECT key_digest = idempotency.key_digest(key) AS digest_of_key,
       request_hash = sha256('kd-3 request') AS request_hash_kept,
       status IS NULL AS no_status
  FROM idempotency.keys WHERE key = 'kd-3';
-- A row in the layout before 0.4, as a dump of 0.1 to 0.3 loads it, is
-- refused (0A000): its request_hash is text (a client's hash, or the hex
-- of a fingerprint), not 32 bytes; 0.1's and 0.2's rows have a status.
-- Nothing is stored.
SELECT sqlstate_of($$INSERT INTO idempotency.keys (scope, key, request_hash, status, response, created_at, expires_at)
  VALUES (current_user::text::idempotency.role_scope, 'kd-4', 'client-hash', 'done', '"by 0.2"',
          now(), now() + interval '1 day')$$) AS text_hash_and_status;
SELECT sqlstate_of($$INSERT INTO idempotency.keys (scope, key, request_hash, response, created_at, expires_at)
  VALUES (current_user::text::idempotency.role_scope, 'kd-4', convert_to(repeat('ab', 32), 'UTF8'), '"by 0.3"',
          now(), now() + interval '1 day')$$) AS hex_text_hash;
SELECT sqlstate_of($$INSERT INTO idempotency.keys (scope, key, request_hash, status, response, created_at, expires_at)
  VALUES (current_user::text::idempotency.role_scope, 'kd-4', sha256('kd-4 request'), 'done', '"by 0.2"',
          now(), now() + interval '1 day')$$) AS fingerprint_and_status;
SELECT count(*) AS kd_4_rows FROM idempotency.keys WHERE key = 'kd-4';
-- The loaded row is found through its digest: another request is IK422.
SELECT sqlstate_of($$SELECT idempotency.idempotent_call('kd-3', NULL, 'SELECT 1')$$) AS other_request;
-- The trigger is for rows that arrive without idempotent_call: it fires
-- for a call's INSERT too, and leaves the call's row as it is.
BEGIN;
SET LOCAL track_functions = 'all';
SELECT idempotency.idempotent_call('kd-5', NULL, 'SELECT 5');
SELECT count(*) AS trigger_calls_by_idempotent_call FROM pg_stat_xact_user_functions
 WHERE schemaname = 'idempotency' AND funcname = 'keys_loaded';
INSERT INTO idempotency.keys (scope, key, request_hash, response, created_at, expires_at)
VALUES (current_user::text::idempotency.role_scope, 'kd-6', sha256('h'), '6', now(), now() + interval '1 day');
SELECT calls AS trigger_calls_by_insert FROM pg_stat_xact_user_functions
 WHERE schemaname = 'idempotency' AND funcname = 'keys_loaded';
ROLLBACK;
-- A call's row and a row loaded by INSERT or COPY have all ten columns
-- (a 32-byte header with its null bitmap).
CREATE EXTENSION pageinspect;
CREATE TABLE kd_header AS
SELECT t.t_hoff, t.t_infomask2 & 2047 AS natts, k.key
  FROM idempotency.keys AS k,
       LATERAL heap_page_items(get_raw_page('idempotency.keys', (k.ctid::text::point)[0]::int)) AS t
 WHERE t.t_ctid = k.ctid AND k.key IN ('kd-1', 'kd-3');
SELECT key, t_hoff, natts FROM kd_header ORDER BY key;
DROP TABLE kd_header;
DROP EXTENSION pageinspect;
-- A row without a key is still refused by NOT NULL.
SELECT sqlstate_of($$INSERT INTO idempotency.keys (scope, request_hash, created_at, expires_at)
                     VALUES (current_user::text::idempotency.role_scope, sha256('x'), now(), now() + interval '1 day')$$);

DELETE FROM idempotency.keys WHERE key LIKE 'kd-%';
DROP TABLE kd_runs;
