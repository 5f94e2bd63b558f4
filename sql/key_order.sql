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

DELETE FROM idempotency.keys WHERE key LIKE 'ko-%' OR key LIKE '%-7abc-8def-0123456789ab';
