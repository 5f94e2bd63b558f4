-- Huge responses. A 100 MB response (compressible: it crosses the TOAST
-- threshold and is stored compressed, about 1 MB) is stored and replayed
-- byte for byte; an 8 MB incompressible one is stored out of line as it
-- is. jsonb caps a string or a container at 256 MB (2^28 - 1 bytes), well
-- under PostgreSQL's 1 GB value limit, so a response over the cap fails
-- while fn's result is turned into jsonb (54000): nothing is stored, the
-- server stays up and the key runs fn on its next call. (A 300 MB single
-- string fails the same way, through the same check, but takes twice the
-- time and memory of the 260 MB array used here.)
\i sql/include/setup.sql
SET client_min_messages = warning;
DROP SCHEMA IF EXISTS hostile_huge CASCADE;
RESET client_min_messages;
CREATE SCHEMA hostile_huge;
SET search_path = hostile_huge, public;
-- Past idempotency.max_response_size's 10MB default: as a superuser may.
SET idempotency.max_response_size = '1GB';

CREATE TABLE runs (label text);
CREATE FUNCTION run(label text) RETURNS void LANGUAGE sql
  AS $$ INSERT INTO hostile_huge.runs VALUES (label) $$;
-- Calls fn under key and records the answer's size, digest, first and last
-- three bytes, and whether it was a replay.
CREATE TABLE answers (key text, bytes bigint, digest text, edges text, replayed bool);
CREATE FUNCTION answer(key text, fn text) RETURNS text LANGUAGE sql AS $$
  INSERT INTO hostile_huge.answers
    SELECT key, octet_length(t), md5(t), left(t, 3) || right(t, 3), idempotency.last_call_replayed()
      FROM (SELECT idempotency.idempotent_call(key, NULL, fn)::text AS t) AS a
  RETURNING 'answered'
$$;

-- 100 MB, compressible: the replay answers the same bytes.
SELECT answer('huge-100mb', 'SELECT repeat(''x'', 100 * 1024 * 1024) FROM hostile_huge.run(''100mb'')');
SELECT answer('huge-100mb', 'SELECT repeat(''x'', 100 * 1024 * 1024) FROM hostile_huge.run(''100mb'')');
SELECT bytes, edges, replayed FROM answers WHERE key = 'huge-100mb' ORDER BY replayed;
SELECT count(DISTINCT digest) AS distinct_answers FROM answers WHERE key = 'huge-100mb';
SELECT count(*) AS runs FROM runs WHERE label = '100mb';
SELECT pg_column_size(response) < 2 * 1024 * 1024 AS stored_compressed
  FROM idempotency.keys WHERE key = 'huge-100mb';

-- 8 MB that does not compress: stored out of line as it is.
SELECT answer('huge-8mb', 'SELECT string_agg(md5(g::text), '''') FROM generate_series(1, 250000) AS g');
SELECT answer('huge-8mb', 'SELECT string_agg(md5(g::text), '''') FROM generate_series(1, 250000) AS g');
SELECT bytes, edges, replayed FROM answers WHERE key = 'huge-8mb' ORDER BY replayed;
SELECT count(DISTINCT digest) AS distinct_answers FROM answers WHERE key = 'huge-8mb';
SELECT pg_column_size(response) >= 8000000 AS stored_uncompressed
  FROM idempotency.keys WHERE key = 'huge-8mb';

-- Over jsonb's cap: 260 rows of 1 MB make one 260 MB array.
SELECT sqlstate_of($$SELECT idempotency.idempotent_call('huge-over-cap', NULL,
  'SELECT repeat(''x'', 1024 * 1024) FROM generate_series(1, 260), hostile_huge.run(''over-cap'')')$$);
SELECT count(*) AS stored FROM idempotency.keys WHERE key = 'huge-over-cap';
SELECT count(*) AS runs FROM runs WHERE label = 'over-cap';
SELECT idempotency.idempotent_call('huge-over-cap', NULL, 'SELECT 1'), idempotency.last_call_replayed();

-- A 10 MB argument: fingerprinted and bound like any other; one byte
-- changed at its end is another request.
SELECT idempotency.idempotent_call('huge-argument', NULL, 'SELECT octet_length($1)', repeat('y', 10 * 1024 * 1024));
SELECT idempotency.idempotent_call('huge-argument', NULL, 'SELECT octet_length($1)', repeat('y', 10 * 1024 * 1024)),
       idempotency.last_call_replayed();
SELECT sqlstate_of($$SELECT idempotency.idempotent_call('huge-argument', NULL, 'SELECT octet_length($1)', repeat('y', 10 * 1024 * 1024 - 1) || 'z')$$);

DELETE FROM idempotency.keys WHERE key LIKE 'huge-%';
SET client_min_messages = warning;
DROP SCHEMA hostile_huge CASCADE;
RESET client_min_messages;
RESET search_path;
RESET idempotency.max_response_size;
