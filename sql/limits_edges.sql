-- Every limit tried at the limit and one past it: idempotency.max_response_size
-- (for a response, a multi-byte one, a stored error document and a
-- response given to complete()); a TTL that ends just before the end of
-- timestamptz's range and one that ends past it; a claim whose TTL would
-- have passed before complete() and one that passes before COMMIT; errors
-- stored through claim/complete; the statement cache beyond its 1,024 fn
-- texts.
\i sql/include/setup.sql
CREATE TABLE edge_runs (key text NOT NULL, n int);
-- Records its run, then answers `bytes` bytes of `unit` (each of
-- octet_length(unit) bytes) as a jsonb string.
CREATE FUNCTION edge_text(key text, unit text, bytes int) RETURNS jsonb LANGUAGE sql AS $$
  INSERT INTO edge_runs VALUES (key, bytes);
  SELECT to_jsonb(repeat(unit, bytes / octet_length(unit)))
$$;
-- Counts its run in a sequence (which no rollback undoes: a stored error
-- rolls fn's effects back), then fails with P0001 and a message of `bytes`
-- bytes.
CREATE SEQUENCE edge_declines;
CREATE FUNCTION edge_decline(key text, bytes int) RETURNS jsonb LANGUAGE plpgsql AS $$
BEGIN
  PERFORM nextval('edge_declines');
  RAISE EXCEPTION '%', repeat('m', bytes);
END $$;
CREATE FUNCTION runs_of(k text) RETURNS bigint LANGUAGE sql
  AS $$ SELECT count(*) FROM edge_runs WHERE key = k $$;
CREATE FUNCTION declines() RETURNS bigint LANGUAGE sql
  AS $$ SELECT CASE WHEN is_called THEN last_value ELSE 0 END FROM edge_declines $$;
CREATE FUNCTION stored(k text) RETURNS bigint LANGUAGE sql
  AS $$ SELECT count(*) FROM idempotency.keys WHERE key = k $$;

-- --- max_response_size ---------------------------------------------------------

-- The limit counts the response's bytes as jsonb stores them: a string of
-- n bytes is n + 12 bytes of jsonb. With the limit at 1kB, 1012 bytes of
-- text is exactly 1024 and is stored; 1013 is one byte over: 54000, fn's
-- effects undone, nothing stored, the retry runs fn again.
SELECT pg_column_size(to_jsonb(repeat('x', 1012))) AS jsonb_bytes_at_limit;
SET idempotency.max_response_size = '1kB';
SELECT octet_length(idempotency.idempotent_call('edge-at', NULL,
  'SELECT edge_text($1, $2, $3)', 'edge-at', 'x', 1012)::text) AS text_bytes,
  idempotency.last_call_replayed();
SELECT octet_length(idempotency.idempotent_call('edge-at', NULL,
  'SELECT edge_text($1, $2, $3)', 'edge-at', 'x', 1012)::text) AS text_bytes,
  idempotency.last_call_replayed();
SELECT runs_of('edge-at') AS runs, stored('edge-at');
SELECT sqlstate_of($$SELECT idempotency.idempotent_call('edge-over', NULL,
  'SELECT edge_text($1, $2, $3)', 'edge-over', 'x', 1013)$$);
SELECT runs_of('edge-over') AS runs, stored('edge-over');
-- Multi-byte text counts in bytes, not characters: 506 two-byte characters
-- are the 1012 bytes at the limit; one more byte is over, 507 characters
-- too.
SELECT octet_length(repeat('é', 506)) AS bytes, pg_column_size(to_jsonb(repeat('é', 506))) AS jsonb_bytes;
SELECT length(idempotency.idempotent_call('edge-utf8-at', NULL,
  'SELECT edge_text($1, $2, $3)', 'edge-utf8-at', 'é', 1012) #>> '{}') AS characters;
SELECT idempotency.idempotent_call('edge-utf8-at', NULL,
  'SELECT edge_text($1, $2, $3)', 'edge-utf8-at', 'é', 1012) = to_jsonb(repeat('é', 506)) AS same_text,
  idempotency.last_call_replayed();
SELECT sqlstate_of($$SELECT idempotency.idempotent_call('edge-utf8-over', NULL,
  'SELECT to_jsonb((edge_text($1, $2, $3) #>> ''{}'') || ''x'')', 'edge-utf8-over', 'é', 1012)$$);
SELECT sqlstate_of($$SELECT idempotency.idempotent_call('edge-utf8-over', NULL,
  'SELECT edge_text($1, $2, $3)', 'edge-utf8-over', 'é', 1014)$$);
SELECT runs_of('edge-utf8-over') AS runs, stored('edge-utf8-over');

-- A stored error document is held to the same limit. Its size is its
-- message's bytes plus 90: a 934-byte message is exactly 1024 and is
-- stored (every retry replays it, fn runs once); 935 is over: 54000,
-- nothing stored, and the retry runs fn again.
SELECT pg_column_size(jsonb_build_object('error', jsonb_build_object(
  'sqlstate', 'P0001', 'message', repeat('m', 934), 'detail', NULL, 'hint', NULL))) AS document_bytes;
SET idempotency.store_errors = 'P0001';
SELECT octet_length(idempotency.idempotent_call('edge-error-at', NULL,
  'SELECT edge_decline($1, $2)', 'edge-error-at', 934) #>> '{error,message}') AS message_bytes;
SELECT outcome FROM idempotency.last_call();
SELECT octet_length(idempotency.idempotent_call('edge-error-at', NULL,
  'SELECT edge_decline($1, $2)', 'edge-error-at', 934) #>> '{error,message}') AS message_bytes;
SELECT outcome FROM idempotency.last_call();
SELECT declines() AS runs, stored('edge-error-at');
SELECT sqlstate_of($$SELECT idempotency.idempotent_call('edge-error-over', NULL,
  'SELECT edge_decline($1, $2)', 'edge-error-over', 935)$$);
SELECT sqlstate_of($$SELECT idempotency.idempotent_call('edge-error-over', NULL,
  'SELECT edge_decline($1, $2)', 'edge-error-over', 935)$$);
SELECT declines() AS runs_in_all, stored('edge-error-over');
RESET idempotency.store_errors;

-- complete(): exactly at the limit is stored; one byte over is 54000 and
-- the claim stays open for another complete() or release().
BEGIN;
SELECT replayed FROM idempotency.claim('edge-complete', NULL);
SELECT sqlstate_of($$SELECT idempotency.complete('edge-complete', to_jsonb(repeat('x', 1013)))$$);
SELECT idempotency.complete('edge-complete', to_jsonb(repeat('é', 506)));
COMMIT;
SELECT replayed, response = to_jsonb(repeat('é', 506)) AS same_response
  FROM idempotency.claim('edge-complete', NULL);
RESET idempotency.max_response_size;

-- --- errors as outcomes through claim/complete ---------------------------------

-- Handler code stores its own error document with complete(): a retry's
-- claim() replays it and last_call() says it is a stored error.
-- idempotency.store_errors is for idempotent_call's fn: an error the
-- handler raises between claim() and complete() is not stored, even when
-- listed; its transaction fails and the key stays free for the retry.
SET idempotency.store_errors = 'P0001';
BEGIN;
SELECT replayed FROM idempotency.claim('edge-handler-raises', 'order 1');
SELECT edge_decline('edge-handler-raises', 3);
COMMIT;
SELECT state FROM idempotency.lookup('edge-handler-raises');
BEGIN;
SELECT replayed FROM idempotency.claim('edge-handler-raises', 'order 1');
SAVEPOINT handler;
SELECT edge_decline('edge-handler-raises', 3);
ROLLBACK TO SAVEPOINT handler;
SELECT idempotency.complete('edge-handler-raises',
  '{"error": {"sqlstate": "P0001", "message": "mmm", "detail": null, "hint": null}}');
COMMIT;
SELECT replayed, response FROM idempotency.claim('edge-handler-raises', 'order 1');
SELECT outcome FROM idempotency.last_call();
SELECT sqlstate_of($$SELECT idempotency.claim('edge-handler-raises', 'order 2')$$);
RESET idempotency.store_errors;

-- --- TTL at the end of timestamptz's range -------------------------------------

-- A TTL that ends one day before the end of the range (294276 AD) is
-- accepted: its key is stored with that expiry, replays, and expiry leaves
-- it alone. One that ends a second past the end is refused when set, for
-- max_ttl and ttl alike.
SELECT set_config('idempotency.max_ttl', (timestamptz '294276-12-31 23:59:59.999999+00'
  - clock_timestamp() - interval '1 day')::text, false) IS NOT NULL AS max_ttl_set;
SELECT set_config('idempotency.ttl', current_setting('idempotency.max_ttl'), false) IS NOT NULL AS ttl_set;
SELECT idempotency.idempotent_call('edge-far', NULL, 'SELECT 1'), idempotency.last_call_replayed();
SELECT idempotency.idempotent_call('edge-far', NULL, 'SELECT 1'), idempotency.last_call_replayed();
SELECT expires_at > timestamptz '294276-12-30 00:00:00+00' AS ends_in_the_last_days,
       expires_at < timestamptz '294276-12-31 23:59:59.999999+00' AS within_range
  FROM idempotency.keys WHERE key = 'edge-far';
SELECT idempotency.expire() IS NOT NULL AS expiry_ran;
SELECT state FROM idempotency.lookup('edge-far');
SELECT left(sqlstate_of(format('SET idempotency.max_ttl = %L', timestamptz '294276-12-31 23:59:59.999999+00'
  - clock_timestamp() + interval '1 second')), 5) AS refused;
SELECT left(sqlstate_of(format('SET idempotency.ttl = %L', timestamptz '294276-12-31 23:59:59.999999+00'
  - clock_timestamp() + interval '1 second')), 5) AS refused;
RESET idempotency.ttl;
RESET idempotency.max_ttl;

-- --- a claim's TTL and COMMIT --------------------------------------------------

-- A key's TTL counts from complete(), which writes it: a claim held longer
-- than the TTL before complete() commits, and its key lives the TTL from
-- complete().
BEGIN;
SET LOCAL idempotency.ttl = '1 second';
SELECT replayed FROM idempotency.claim('edge-slow-claim', NULL);
SELECT clock_timestamp() AS claimed_at \gset
SELECT pg_sleep(1.2);
SELECT idempotency.complete('edge-slow-claim', '{"done": true}');
COMMIT;
SELECT created_at >= :'claimed_at'::timestamptz + interval '1.2 seconds' AS counted_from_complete,
       expires_at - created_at AS ttl
  FROM idempotency.keys WHERE key = 'edge-slow-claim';
-- A TTL that passes between complete() and COMMIT: the commit fails with
-- 40001, nothing is stored, and the key is free for the retry.
BEGIN;
SET LOCAL idempotency.ttl = '100 milliseconds';
SELECT replayed FROM idempotency.claim('edge-late-commit', NULL);
SELECT idempotency.complete('edge-late-commit', '{"done": true}');
SELECT pg_sleep(0.2);
\set VERBOSITY terse
COMMIT;
\set VERBOSITY default
SELECT stored('edge-late-commit');
BEGIN;
SELECT replayed FROM idempotency.claim('edge-late-commit', NULL);
ROLLBACK;

-- --- the statement cache beyond its 1,024 fn texts -----------------------------

-- A session keeps the statements of its first 1,024 fn texts; beyond them
-- statements are built for each call and not kept. 1,100 fn texts, each
-- called with a key of its own, run once; their retries replay; new keys
-- for the same texts (kept or not) run once again, each with its own
-- arguments.
CREATE FUNCTION edge_cached(key text, n int, v text) RETURNS jsonb LANGUAGE sql AS $$
  INSERT INTO edge_runs VALUES (key, n);
  SELECT jsonb_build_object('n', n, 'v', v)
$$;
DO $$
DECLARE
  response jsonb;
BEGIN
  FOR round IN 1 .. 3 LOOP
    FOR n IN 1 .. 1100 LOOP
      response := idempotency.idempotent_call(
        'edge-cache-' || CASE WHEN round = 3 THEN 'b' ELSE 'a' END || n, NULL,
        format('SELECT edge_cached($1, $2, $3) AS r%s', n),
        'edge-cache-' || CASE WHEN round = 3 THEN 'b' ELSE 'a' END || n, n,
        CASE WHEN round = 3 THEN 'b' ELSE 'a' END);
      IF response <> jsonb_build_object('n', n, 'v', CASE WHEN round = 3 THEN 'b' ELSE 'a' END)
         OR idempotency.last_call_replayed() <> (round = 2) THEN
        RAISE EXCEPTION 'round %, fn text %: answered %, replayed %', round, n, response,
          idempotency.last_call_replayed();
      END IF;
    END LOOP;
  END LOOP;
END $$;
SELECT count(*) AS runs, count(DISTINCT key) AS keys, count(*) FILTER (WHERE key <> 'edge-cache-a' || n
       AND key <> 'edge-cache-b' || n) AS runs_with_other_arguments
  FROM edge_runs WHERE key LIKE 'edge-cache-%';
-- In a new session (an empty cache), the same texts replay.
\c
DO $$
BEGIN
  FOR n IN 1 .. 1100 LOOP
    IF idempotency.idempotent_call('edge-cache-a' || n, NULL,
         format('SELECT edge_cached($1, $2, $3) AS r%s', n), 'edge-cache-a' || n, n, 'a'::text)
       <> jsonb_build_object('n', n, 'v', 'a') OR NOT idempotency.last_call_replayed() THEN
      RAISE EXCEPTION 'fn text % did not replay in a new session', n;
    END IF;
  END LOOP;
END $$;
SELECT count(*) AS runs FROM edge_runs WHERE key LIKE 'edge-cache-%';

DELETE FROM idempotency.keys WHERE key LIKE 'edge-%';
DROP FUNCTION edge_text(text, text, int), edge_decline(text, int), edge_cached(text, int, text),
  runs_of(text), declines(), stored(text);
DROP SEQUENCE edge_declines;
DROP TABLE edge_runs;
