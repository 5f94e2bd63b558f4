-- key_digest follows the key's own order when the key has one, so that a
-- time-ordered or sequential series is appended at its own edge of the
-- primary key: a UUIDv7 begins with its 48-bit timestamp, a key ending in 6
-- to 18 digits (after a prefix that is empty or not all hex digits and
-- dashes) with a hash of its prefix and then its number. Every other key
-- keeps SHA-256's first 11 bytes.
\i sql/include/setup.sql

SELECT key, octet_length(idempotency.key_digest(key)) AS digest_bytes,
       idempotency.key_digest(key) = substring(sha256(convert_to(key, 'UTF8')) FOR 11) AS sha256_prefix
  FROM (VALUES ('ko-random'),
               ('0190a4b2-7c3d-7123-8456-0123456789ab'),   -- UUIDv7
               ('0190a4b2-7c3d-4123-8456-0123456789ab'),   -- UUIDv4
               ('0190a4b2-7c3d-7123-c456-0123456789ab'),   -- not RFC 9562's variant
               ('order-000000123'),                        -- 9 trailing digits
               ('order-12345'),                            -- 5: too few
               ('order-1234567890123456789'),              -- 19: too many
               ('000000123456'),                           -- a plain number
               ('4b2f9a8e-3c1d-4e5f-9a0b-1c2d3e123456')    -- a UUIDv4 ending in digits
       ) AS k (key);
SELECT substring(idempotency.key_digest('0190a4b2-7c3d-7123-8456-0123456789ab') FOR 6) AS uuid7_timestamp,
       substring(idempotency.key_digest('0190a4b2-7c3d-7123-8456-0123456789ab') FROM 7)
         = substring(sha256(convert_to('0190a4b2-7c3d-7123-8456-0123456789ab', 'UTF8')) FOR 8) AS then_sha256,
       substring(idempotency.key_digest('order-000000123') FROM 9) AS then_number,
       substring(idempotency.key_digest('order-000000123') FOR 8)
         = substring(idempotency.key_digest('order-000000999') FOR 8) AS one_prefix,
       substring(idempotency.key_digest('order-000000123') FOR 8)
         = substring(idempotency.key_digest('order-0000000123') FOR 8) AS one_prefix_other_length;

-- Keys stored in any order lie in the primary key in the series' order,
-- each found by one probe of it, and replay.
SELECT count(idempotency.idempotent_call('ko-' || lpad(i::text, 9, '0'), NULL, 'SELECT $1', i))
  FROM (SELECT i FROM generate_series(1, 300) AS i ORDER BY (i * 7919) % 300) AS shuffled;
CREATE FUNCTION pg_temp.uuid7(i int) RETURNS text LANGUAGE sql AS $$
  SELECT overlay(lpad(to_hex(1700000000000 + i), 12, '0') PLACING '-' FROM 9 FOR 0) || '-7abc-8def-0123456789ab'
$$;
SELECT count(idempotency.idempotent_call(pg_temp.uuid7(i), NULL, 'SELECT $1', i))
  FROM (SELECT i FROM generate_series(1, 300) AS i ORDER BY (i * 7919) % 300) AS shuffled;
SELECT count(*) AS keys,
       array_agg(key ORDER BY key_digest) = array_agg(key ORDER BY key) AS digest_order_is_key_order
  FROM idempotency.keys WHERE key LIKE 'ko-%'
UNION ALL
SELECT count(*), array_agg(key ORDER BY key_digest) = array_agg(key ORDER BY key)
  FROM idempotency.keys WHERE key LIKE '%-7abc-8def-0123456789ab';
SELECT idempotency.idempotent_call('ko-000000150', NULL, 'SELECT $1', 150), idempotency.last_call_replayed();
SELECT pg_temp.uuid7(150), idempotency.idempotent_call(pg_temp.uuid7(150), NULL, 'SELECT $1', 150),
       idempotency.last_call_replayed();
SET enable_seqscan = off;
EXPLAIN (COSTS OFF)
SELECT key FROM idempotency.keys
 WHERE scope OPERATOR(idempotency.=) idempotency.current_scope()
   AND key_digest = idempotency.key_digest('ko-000000150');
RESET enable_seqscan;

-- A database whose extension is still at 0.6 holds every key's unordered
-- digest: calls made through this library store and find them so, rows
-- loaded there get them too; the update to 0.7 recomputes the digests of
-- ordered keys, and every key keeps replaying.
SELECT current_database() AS home_database \gset
CREATE DATABASE ko_upgrade;
\c ko_upgrade
CREATE EXTENSION idempotency VERSION '0.6';
\i sql/include/setup.sql
CREATE TABLE ko_runs (key text);
SELECT idempotency.idempotent_call(key, NULL, 'INSERT INTO ko_runs VALUES ($1) RETURNING key', key)
  FROM (VALUES ('ko-random'), ('0190a4b2-7c3d-7123-8456-0123456789ab'), ('order-000000123')) AS k (key);
INSERT INTO idempotency.keys (scope, key, request_hash, response, created_at, expires_at)
VALUES (current_user::text::idempotency.role_scope, 'order-000000124', sha256('loaded'), '"loaded"',
        now(), now() + interval '1 day');
SELECT key, key_digest = substring(sha256(convert_to(key, 'UTF8')) FOR 11) AS unordered
  FROM idempotency.keys ORDER BY key;
SELECT idempotency.idempotent_call('order-000000123', NULL, 'INSERT INTO ko_runs VALUES ($1) RETURNING key', 'order-000000123'),
       idempotency.last_call_replayed();
-- Three of the four rows change: the update rewrites the table.
SELECT pg_relation_filenode('idempotency.keys') AS filenode_06 \gset
ALTER EXTENSION idempotency UPDATE;
SELECT extversion, pg_relation_filenode('idempotency.keys') <> :filenode_06 AS rewritten
  FROM pg_extension WHERE extname = 'idempotency';
SELECT key, key_digest = idempotency.key_digest(key) AS digest_of_key, octet_length(key_digest) AS digest_bytes
  FROM idempotency.keys ORDER BY key;
SELECT key, idempotency.idempotent_call(key, NULL, 'INSERT INTO ko_runs VALUES ($1) RETURNING key', key),
       idempotency.last_call_replayed()
  FROM (VALUES ('ko-random'), ('0190a4b2-7c3d-7123-8456-0123456789ab'), ('order-000000123')) AS k (key);
SELECT sqlstate_of($$SELECT idempotency.idempotent_call('order-000000124', NULL, 'SELECT 1')$$) AS loaded_other_request;
SELECT key FROM ko_runs ORDER BY key;
-- A new ordered key is stored under its ordered digest; a loaded row gets it.
SELECT idempotency.idempotent_call('order-000000125', NULL, 'SELECT 125');
INSERT INTO idempotency.keys (scope, key, request_hash, response, created_at, expires_at)
VALUES (current_user::text::idempotency.role_scope, 'order-000000126', sha256('loaded'), '"loaded"',
        now(), now() + interval '1 day');
SELECT key, key_digest = idempotency.key_digest(key) AS digest_of_key, octet_length(key_digest) AS digest_bytes
  FROM idempotency.keys WHERE key IN ('order-000000125', 'order-000000126') ORDER BY key;
-- A table of random keys with a few ordered ones: only their rows are
-- updated, in place.
\c :home_database
DROP DATABASE ko_upgrade;
CREATE DATABASE ko_upgrade;
\c ko_upgrade
CREATE EXTENSION idempotency VERSION '0.6';
\i sql/include/setup.sql
SELECT count(idempotency.idempotent_call(key, NULL, 'SELECT $1', key))
  FROM (SELECT 'ko-random-' || i AS key FROM generate_series(1, 40) AS i
        UNION ALL SELECT 'order-000000123') AS k;
SELECT pg_relation_filenode('idempotency.keys') AS filenode_06 \gset
ALTER EXTENSION idempotency UPDATE;
SELECT pg_relation_filenode('idempotency.keys') = :filenode_06 AS updated_in_place,
       count(*) FILTER (WHERE key_digest = idempotency.key_digest(key)) AS digests_of_keys,
       count(*) FILTER (WHERE octet_length(key_digest) = 16) AS ordered
  FROM idempotency.keys;
SELECT idempotency.idempotent_call('order-000000123', NULL, 'SELECT $1', 'order-000000123'::text),
       idempotency.last_call_replayed();
\c :home_database
DROP DATABASE ko_upgrade;

DELETE FROM idempotency.keys WHERE key LIKE 'ko-%' OR key LIKE '%-7abc-8def-0123456789ab';
